"""Versioned configuration: types in v1 (which refuse what no config may hold); loader (the public API) over
document (reading, decoding), schema (known keys), sections and resource_sections (each section into its v1
type); the flag/env names in options and their precedence in flags; selection, source and watch."""

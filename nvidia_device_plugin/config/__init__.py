"""Versioned configuration: types in v1; loader (the public API) over document (reading, decoding), schema
(known keys) and sections (validation into v1 types); flag/env precedence in flags; source and watch."""

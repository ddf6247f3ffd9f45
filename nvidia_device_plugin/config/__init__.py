"""Versioned configuration: types in v1, parsing/validation in loader, flag/env precedence in flags."""

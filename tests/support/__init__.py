"""Helpers shared by the tests: fakes at the boundaries, node builders, waiting."""

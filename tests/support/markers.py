"""Test parameters shared across files."""

from __future__ import annotations

import pytest


def soak(size: int) -> object:
    """A parameter for `make soak` only: marked `soak`, which the default test run deselects."""
    return pytest.param(size, id=f"soak-{size}", marks=[pytest.mark.soak, pytest.mark.timeout(3600)])

"""Assertions over collections that cannot pass vacuously.

`assert all(p(x) for x in xs)` passes when `xs` is empty, which hides a test that looked at nothing (a
race that had not yet produced the items, a filter that matched none). `assert_all` fails then instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def assert_all(items: Iterable[T], predicate: Callable[[T], object], message: object = "") -> None:
    """Fail unless `items` holds at least one item and `predicate` holds for every one; the failure names
    the items that do not satisfy it (and `message`, when given)."""
    listed = list(items)
    note = f" ({message})" if message != "" else ""
    if not listed:
        raise AssertionError(f"no items to check{note}: an empty collection proves nothing")
    failing = [item for item in listed if not predicate(item)]
    if failing:
        raise AssertionError(f"{len(failing)} of {len(listed)} items fail{note}: {failing[:5]!r}")

"""The cyclic garbage collector held off while a daemon starts.

Start-up leaves about 56,000 objects the collector tracks, nearly all of them living as long as the process
(modules' functions and classes, the config, the inventory and plans), and next to no cyclic garbage (347
objects collected in the first 200 ms of a `run`). The collector still went over them about 60 times in those
200 ms: 12 ms of CPU on the way to registering (docs/performance.md). `hold()` turns it off; its release, once
the daemon serves, turns it back on after `gc.freeze()`: what start-up made is left out of every later
collection, so the daemon's periodic work never walks it again. Freezing is O(1); the price is that the few
cycles that became garbage during start-up are never reclaimed, kilobytes once.
"""

from __future__ import annotations

import gc
from collections.abc import Callable


def hold() -> Callable[[], None]:
    """Turn the cyclic collector off; returns the release (idempotent): freeze what exists, turn it on.
    When the collector was off already, holding and releasing change nothing."""
    if not gc.isenabled():
        return _nothing
    gc.disable()
    held = True

    def release() -> None:
        nonlocal held
        if held:
            held = False
            gc.freeze()
            gc.enable()

    return release


def _nothing() -> None:
    pass

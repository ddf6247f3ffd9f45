"""Waiting for something another thread or process does. The time limits only turn a hang into a failure;
they measure nothing (speed is measured by `make bench`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

HANG_GUARD_S = 10.0
# For a wait on a child process, which first imports the package and starts the simulator on busy cores.
CHILD_GUARD_S = 15.0


def eventually(condition: Callable[[], bool], timeout: float = HANG_GUARD_S, poll_s: float = 0.005) -> bool:
    """Whether `condition` came true within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def wait_for(condition: Callable[[], bool], what: str, timeout: float = HANG_GUARD_S) -> None:
    """Wait for `condition`; fail the test naming `what` if it never comes true."""
    if not eventually(condition, timeout):
        pytest.fail(f"timed out waiting for {what}")

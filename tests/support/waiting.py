"""Waiting for something another thread or process does. The time limits only turn a hang into a failure;
they measure nothing (speed is measured by `make bench`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest

# One factor for every wait budget of the suite, so that a busy machine gets more time, never a different
# assertion. The default is sized for a 2-core machine running a second `make test` beside this one (4-5
# waits of 10 s failed there unscaled); NVDP_TEST_WAIT_SCALE sets another (a positive number).
WAIT_SCALE_VARIABLE = "NVDP_TEST_WAIT_SCALE"
DEFAULT_WAIT_SCALE = 3.0


def _wait_scale() -> float:
    text = os.environ.get(WAIT_SCALE_VARIABLE, "").strip()
    if not text:
        return DEFAULT_WAIT_SCALE
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise ValueError(f"{WAIT_SCALE_VARIABLE}={text!r} is not a positive number of times the wait budgets")
    return value


WAIT_SCALE = _wait_scale()


def scaled(seconds: float) -> float:
    """A wait budget of `seconds` on an idle machine, scaled to this one."""
    return seconds * WAIT_SCALE


HANG_GUARD_S = scaled(10.0)

# The NVML call deadline of tests that hang a call: only the hung call may reach it. Reading a whole GPU is
# one call on its lane (nvml/discovery.py), about 3 ms, but it took 0.3 s once in CI beside the rest of the
# suite on 2 busy cores, which a 0.1 s deadline served as a hang. (The daemon's default is 10 s.)
NVML_CALL_DEADLINE_S = 1.0
# For a wait on a child process, which first imports the package and starts the simulator on busy cores.
CHILD_GUARD_S = scaled(15.0)


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

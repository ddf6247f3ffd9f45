"""How the long-running commands take their signals: SIGHUP reloads, SIGTERM and SIGINT stop.

Signals are taken synchronously with sigwait: a Python handler that sets an Event can deadlock when the
signal lands while the main thread holds that Event's lock. Blocking them before any thread starts makes
every thread inherit the mask, so only sigwait ever sees them.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

log = logging.getLogger(__name__)

HANDLED = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


def serve_until_stopped(
    start: Callable[[], None], reload: Callable[[str], object], stop: Callable[[], None]
) -> None:
    """Block the handled signals, `start()`, `reload("SIGHUP")` on each SIGHUP until SIGTERM or SIGINT,
    then `stop()` (also when `start()` raises) and unblock them again."""
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:
        start()
        while True:
            signum = signal.sigwait(HANDLED)
            if signum == signal.SIGHUP:
                reload("SIGHUP")
                continue
            log.info("received %s", signal.Signals(signum).name)
            return
    finally:
        stop()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)

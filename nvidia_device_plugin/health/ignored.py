"""Ignored XIDs in the log without a storm of them flooding it.

The first ignored XID in each window (a minute) is logged at INFO with its device; further ones in that
window are counted, per XID for up to _MAX_DISTINCT_IGNORED distinct ones and as "other" beyond, and summed
up in one line when the window is over, so a storm costs two lines a minute.
"""

from __future__ import annotations

import logging
from collections import Counter

from nvidia_device_plugin.health.policy import xid_reason

log = logging.getLogger(__name__)

IGNORED_LOG_WINDOW_S = 60.0
_MAX_DISTINCT_IGNORED = 32  # distinct XIDs counted per window; the rest are summed as "other"


class IgnoredXidLog:
    """Touched by the health monitor's thread only."""

    def __init__(self, window_s: float = IGNORED_LOG_WINDOW_S) -> None:
        self._window_s = window_s
        self._window_end: float | None = None
        self._counts: Counter[int] = Counter()
        self._other = 0

    def record(self, now: float, where: str, xid: int) -> None:
        self.flush(now)
        if self._window_end is None:
            log.info("ignored %s on %s: not critical under the health policy", xid_reason(xid), where)
            self._window_end = now + self._window_s
        elif xid in self._counts or len(self._counts) < _MAX_DISTINCT_IGNORED:
            self._counts[xid] += 1
        else:
            self._other += 1

    def flush(self, now: float) -> None:
        if self._window_end is None or now < self._window_end:
            return
        total = sum(self._counts.values()) + self._other
        if total:
            parts = [f"XID {xid} x{n}" for xid, n in sorted(self._counts.items())]
            if self._other:
                parts.append(f"other XIDs x{self._other}")
            log.info(
                "ignored %d more non-critical XID events in %gs: %s", total, self._window_s, ", ".join(parts)
            )
        self._window_end = None
        self._counts.clear()
        self._other = 0

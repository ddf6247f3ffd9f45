"""Counting a process's threads, for the checks that nothing leaks them."""

from __future__ import annotations

import threading

# Threads a worker makes only when its first piece of work comes (Worker.start_thread), at most one each
# per owner: a rate-limited log's summaries (its first line left out), the reload retry (its first retry)
# and GPU re-discovery (the first GPU discovery could not read). A leak check that counted them would see
# one come during the test and take it for a leak.
MADE_ON_DEMAND = frozenset(
    {"log-summaries", "plugin-stream-lines", "plugin-call-lines", "reload-retry", "gpu-rediscovery"}
)


def counted_threads() -> int:
    """How many threads are alive, not counting the first of each name in MADE_ON_DEMAND: one of each may
    come at any time, a second one is counted like any other thread, so a leak of these threads (a
    server's summaries never stopped) still shows."""
    names = [thread.name for thread in threading.enumerate()]
    return len(names) - len(MADE_ON_DEMAND.intersection(names))


# The device-plugin directory's watch (plugin/dirwatch.py): made by the registrar once its first
# registrations are done, so after kubelet already sees the resources. A leak check counts after it.
DIRECTORY_WATCH = "plugin-dir-watch"


def threads_named(name: str) -> list[threading.Thread]:
    """The live threads named `name`."""
    return [thread for thread in threading.enumerate() if thread.name == name]

"""The daemon's labels file: rewritten by one thread whenever the snapshot or GPU health changes.

`notify()` is cheap and never blocks (the daemon calls it from reloads and health listeners); the thread
recomputes the labels and rewrites the file only when they changed (the timestamp alone does not count),
so the file changes within milliseconds of a reload, a MIG layout change or a whole-GPU health change.
A write that fails is logged once per distinct reason and retried with backoff until it succeeds.

On stop the file is left in place: NFD keeps a file's labels until the file disappears, and a plugin
restart (upgrade, node drain) must not strip the node's labels while pods are being scheduled on them.
Delete the file (or the DaemonSet's hostPath directory) to remove the labels for good.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.base.workers import Worker
from nvidia_device_plugin.labels.nfd import DEFAULT_MACHINE_TYPE_FILE, read_machine_type, write_features
from nvidia_device_plugin.labels.node import LabelSettings, node_labels, without_timestamp
from nvidia_device_plugin.snapshot import Snapshot

log = logging.getLogger(__name__)

RETRY_MIN_S = 1.0
RETRY_MAX_S = 60.0
_WRITE = "write"  # the one failure this writer keeps: the last write's

# What the writer reads at each rewrite: the snapshot served now (None: nothing served, e.g. no NVML) and
# the physical UUIDs marked unhealthy.
LabelSource = Callable[[], tuple[Snapshot | None, Collection[str]]]


@dataclass(frozen=True)
class LabelsOptions:
    path: Path
    no_timestamp: bool = False
    machine_type_file: str = DEFAULT_MACHINE_TYPE_FILE


class LabelsFileWriter:
    """The labels file and the thread that rewrites it ("labels-writer"): its owner starts and stops
    `worker`; `notify` may be called any number of times, before, during and after."""

    def __init__(self, options: LabelsOptions, source: LabelSource) -> None:
        self.options = options
        self._source = source
        self._settings = LabelSettings(
            no_timestamp=options.no_timestamp, machine_type=read_machine_type(options.machine_type_file)
        )
        self._wake = threading.Event()
        self._written: dict[str, str] | None = None  # last labels written, without the timestamp
        self._failures = FailureLog(log)
        self.worker = Worker("labels-writer", self._run, interrupt=self._wake.set)

    def notify(self) -> None:
        """Ask for the labels to be recomputed (and the file rewritten if they changed)."""
        self._wake.set()

    @property
    def failure(self) -> str | None:
        """Why the last write failed (the line logged), or None when the file is up to date."""
        return self._failures.reason(_WRITE)

    def labels_now(self) -> dict[str, str]:
        snapshot, unhealthy = self._source()
        if snapshot is None:
            return {}
        return node_labels(
            snapshot.inventory, snapshot.config, unhealthy, self._settings, timestamp=int(time.time())
        )

    def _run(self, stop: threading.Event) -> None:
        delay: float | None = None  # seconds to the next retry after a failure; None: wait for notify
        while not stop.is_set():
            self._wake.wait(delay)
            if stop.is_set():
                return
            self._wake.clear()
            try:
                self._rewrite()
            except Exception as exc:  # the thread must outlive any failure: log once, back off, retry
                reason = str(exc) or type(exc).__name__
                self._failures.report(_WRITE, f"labels: {reason}; retrying with backoff", logging.ERROR)
                delay = RETRY_MIN_S if delay is None else min(delay * 2, RETRY_MAX_S)
                continue
            delay = None

    def _rewrite(self) -> None:
        labels = self.labels_now()
        stable = without_timestamp(labels)
        path = self.options.path
        if stable == self._written and path.exists():
            return
        write_features(path, labels)
        before = self._written
        self._written = stable
        if before is None:
            log.info("labels: wrote %d labels to %s", len(labels), path)
        else:
            changed = sorted(k for k in set(before) | set(stable) if before.get(k) != stable.get(k))
            log.info("labels: rewrote %s (changed: %s)", path, ", ".join(changed) or "file was missing")
        if self._failures.clear(_WRITE):
            log.info("labels: %s written again", path)

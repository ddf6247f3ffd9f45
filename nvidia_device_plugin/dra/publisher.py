"""The "dra-slices" worker: keeps this node's ResourceSlices what the daemon last asked for.

`publish(devices, gpus, counter_sets)` hands it the wanted devices (and dynamic MIG's counter sets); the
worker waits DEBOUNCE_S for more (a reload and the health changes around it come together), then syncs
(dra/sync.py) and tells `on_published` the GPUs the API server now holds (the handover waits for that
before a GPU goes back to the device plugin). A failed sync is retried with backoff, RETRY_MIN_S doubling
to RETRY_MAX_S, each distinct failure logged once; every RESYNC_S it syncs again, so a slice deleted
behind its back comes back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.base.workers import Worker
from nvidia_device_plugin.dra.attributes import Json
from nvidia_device_plugin.dra.slices import slice_contents
from nvidia_device_plugin.dra.sync import plan_contents_sync

log = logging.getLogger(__name__)

DEBOUNCE_S = 0.1
RETRY_MIN_S = 1.0
RETRY_MAX_S = 60.0
RESYNC_S = 300.0


class SliceApi(Protocol):
    def node_uid(self, node: str) -> str: ...
    def list(self, node: str) -> list[Json]: ...
    def create(self, obj: Json) -> Json: ...
    def update(self, obj: Json) -> Json: ...
    def delete(self, name: str, uid: str, resource_version: str) -> None: ...


class SlicePublisher(Worker):
    def __init__(
        self, api: SliceApi, node: str, on_published: Callable[[frozenset[str]], None] | None = None
    ) -> None:
        super().__init__("dra-slices")
        self._api = api
        self._node = node
        self._on_published = on_published
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._wanted: tuple[list[Json], frozenset[str], list[Json]] | None = None
        self._version = 0  # bumped by every publish()
        self._node_uid: str | None = None
        self._failures = FailureLog(log)
        # GPUs the API server may hold in our slices: those of the last good sync, and of every sync since
        # (one in flight has written some of its calls already); None before the first good sync.
        self._published: frozenset[str] | None = None
        self._maybe: frozenset[str] = frozenset()
        self.syncs = 0  # good syncs, for tests and metrics

    @property
    def published(self) -> frozenset[str] | None:
        """The GPUs that may be in this node's slices now (None: unknown, before the first good sync)."""
        with self._lock:
            return None if self._published is None else self._published | self._maybe

    def publish(
        self, devices: Sequence[Json], gpus: frozenset[str], counter_sets: Sequence[Json] = ()
    ) -> None:
        with self._lock:
            self._wanted = (list(devices), gpus, list(counter_sets))
            self._version += 1
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        delay = RETRY_MIN_S
        synced_version = -1
        next_try = time.monotonic()
        while not stop.is_set():
            with self._lock:
                version, wanted = self._version, self._wanted
            due = wanted is not None and (version != synced_version or time.monotonic() >= next_try)
            if not due:
                self._wake.clear()
                self._wake.wait(max(0.0, next_try - time.monotonic()) if wanted is not None else None)
                continue
            if stop.wait(DEBOUNCE_S):  # let the rest of a burst of changes arrive
                return
            with self._lock:
                version, wanted = self._version, self._wanted
            assert wanted is not None
            if self._sync(*wanted):
                synced_version, delay = version, RETRY_MIN_S
                next_try = time.monotonic() + RESYNC_S
            else:
                next_try, delay = time.monotonic() + delay, min(delay * 2, RETRY_MAX_S)
                synced_version = -1 if version == synced_version else synced_version

    def _sync(self, devices: list[Json], gpus: frozenset[str], counter_sets: list[Json]) -> bool:
        with self._lock:
            self._maybe |= gpus  # from the first call on, the API server may hold them
        try:
            if self._node_uid is None:
                self._node_uid = self._api.node_uid(self._node)
            contents = slice_contents(devices, counter_sets)
            plan = plan_contents_sync(self._api.list(self._node), contents, self._node, self._node_uid)
            for obj in plan.updates:
                self._api.update(obj)
            for obj in plan.creates:
                self._api.create(obj)
            for name, uid, resource_version in plan.deletes:
                self._api.delete(name, uid, resource_version)
        except Exception as exc:  # an API failure or a bug: the next try may do better, the thread goes on
            self._failures.report("sync", f"publishing the ResourceSlices of node {self._node} failed: {exc}")
            return False
        if self._failures.clear("sync"):
            log.info("ResourceSlices of node %s published again", self._node)
        if not plan.empty:
            log.info(
                "ResourceSlices of node %s: %d device(s) in %d slice(s), pool generation %d",
                self._node, len(devices), len(plan.updates) + len(plan.creates) or 1, plan.generation,
            )  # fmt: skip
        with self._lock:
            self._published, self._maybe = gpus, frozenset()
        self.syncs += 1
        if self._on_published is not None:
            self._on_published(gpus)
        return True

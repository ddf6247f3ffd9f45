"""How a running daemon moves from one snapshot to the next: SnapshotFollower, the one reload funnel both
long-running commands (`run`, `mps-control-daemon`) use, with its two workers: the reload retry and the
re-discovery of GPUs that could not be read. snapshot.py is the pure pipeline this calls.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from nvidia_device_plugin.base.errors import DevicePluginError, NvmlError
from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.base.workers import Worker
from nvidia_device_plugin.cdi.model import CdiError
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.nvml import events as nvml_events
from nvidia_device_plugin.nvml.errors import means_lost
from nvidia_device_plugin.nvml.session import NvmlSession
from nvidia_device_plugin.snapshot import Snapshot, build_snapshot, snapshot_of

log = logging.getLogger(__name__)

# A reload rejected for a transient reason (NVML failing during discovery, the node's CDI files briefly
# unusable) is retried with this backoff.
RELOAD_RETRY_MIN_S = 1.0
RELOAD_RETRY_MAX_S = 60.0
# A GPU held as lost is checked this often (as often as health checks a GPU is readable); one that reads
# again but is still lost after the re-discovery is checked less often, up to REDISCOVERY_BACKOFF_MAX_S.
REDISCOVERY_INTERVAL_S = 5.0
REDISCOVERY_BACKOFF_MAX_S = 300.0

Apply = Callable[[Snapshot, Snapshot], None]  # (new, old): make the daemon act on `new` instead of `old`
InventoryEdit = Callable[[Inventory], Inventory]  # the served inventory -> the one to serve instead
# How the next snapshot is built from the one served now and its session (a reload, a refresh, an edit).
_Build = Callable[[Snapshot, NvmlSession], Snapshot]


def _as_is(snapshot: Snapshot) -> Snapshot:
    return snapshot


def _no_report(applied: bool, message: str) -> None:
    return None


class SnapshotFollower:
    """One daemon's snapshot, and the one way it changes while the daemon runs: `reload(reason)`.

    Both long-running commands (`run`, `mps-control-daemon`) reload through this, so they behave alike:

    * the next snapshot is built from the config as `load_config` reads it now, with the current
      inventory as `previous` (a GPU NVML can no longer open is carried over as lost, see build_snapshot);
    * any error keeps the last good snapshot, with one log line saying what is kept and why;
    * a reload that NVML made fail is retried by itself (the "reload-retry" worker, which the daemon owns),
      `retry_min_s` doubling to `retry_max_s` (RELOAD_RETRY_MIN_S and _MAX_S unless given); a reload that
      lands resets the delay. So is one that `check` refused with a CdiError (a driver root or spec
      directory briefly unusable), whose rejection is logged once per distinct reason; `retry_later` asks
      for such a retry from outside;
    * reloads run one at a time, and the daemon's first serve holds `lock` too, so a change that lands
      during start-up waits for the first snapshot;
    * a GPU the snapshot holds as lost (or could not open) that NVML reads again is re-discovered: the
      "gpu-rediscovery" worker (the daemon owns it) checks those GPUs every `rediscovery_interval_s` and
      then `refresh`es, rebuilding the snapshot under the same config, so everything derived from the
      GPU (its memory and MPS limits, NUMA node, links, MIG devices, CDI specs, labels) follows;
    * a change the daemon made itself and read back (dynamic MIG made or destroyed a MIG device, and the
      GPU was read again) comes in through `edit`: the served inventory with that edit, under the config
      served now, with no discovery of the node and no config read, applied as a reload is.

    `check` may refuse a snapshot the daemon cannot serve (raising DevicePluginError); `apply(new, old)`
    makes the daemon act on it; `on_result(applied, message)` hears every outcome of a reload or refresh
    (metrics: config reloads), not those of an `edit`.
    """

    def __init__(
        self,
        load_config: Callable[[], Config],
        apply: Apply,
        *,
        check: Callable[[Snapshot], Snapshot] = _as_is,
        kept: str = "keeping the previous config",
        on_result: Callable[[bool, str], None] = _no_report,
        rediscovery_interval_s: float = REDISCOVERY_INTERVAL_S,
        retry_min_s: float = RELOAD_RETRY_MIN_S,
        retry_max_s: float = RELOAD_RETRY_MAX_S,
    ) -> None:
        self.lock = threading.Lock()
        self.retry = ReloadRetry(self.reload)
        self.rediscovery = Rediscovery(self, rediscovery_interval_s)
        self._load_config = load_config
        self._apply = apply
        self._check = check
        self._kept = kept
        self._on_result = on_result
        self._session: NvmlSession | None = None
        self._current: Snapshot | None = None
        self._retry_min_s, self._retry_max_s = retry_min_s, retry_max_s
        self._retry_delay_s = retry_min_s
        self._cdi_rejection: str | None = None  # the CDI reason last logged (logged once per reason)

    def first(self, session: NvmlSession, config: Config) -> Snapshot:
        """The first snapshot, which the caller serves holding `lock`; raises as build_snapshot does."""
        snapshot = self._check(build_snapshot(session, config))
        self._session, self._current = session, snapshot
        self._rediscover_if_unread(snapshot)
        return snapshot

    @property
    def current(self) -> tuple[Snapshot | None, NvmlSession | None]:
        """The snapshot served now and the session it was read through (None, None before the first)."""
        return self._current, self._session

    def reload(self, reason: str) -> bool:
        """Apply the config as it reads now; on any error keep the last good snapshot. True when applied."""
        return self._rebuild(
            reason,
            "config reloaded",
            lambda old, session: build_snapshot(session, self._load_config(), previous=old.inventory),
        )

    def refresh(self, reason: str) -> bool:
        """Read the node again under the config served now (a GPU came back); as reload() otherwise."""
        return self._rebuild(
            reason,
            "node re-discovered",
            lambda old, session: build_snapshot(session, old.config, previous=old.inventory),
        )

    def edit(self, reason: str, change: InventoryEdit) -> bool:
        """Serve the inventory served now as `change` makes it (a GPU read again after the daemon changed
        it), under the config served now: no discovery, no config read; as reload() otherwise. An edit
        that changes nothing (the GPU read before a change) applies nothing."""

        def build(old: Snapshot, session: NvmlSession) -> Snapshot:
            inventory = change(old.inventory)
            return old if inventory == old.inventory else snapshot_of(session, old.config, inventory)

        # Not counted as a config reload (the metric): every claim's Prepare and Unprepare comes here.
        return self._rebuild(reason, "inventory updated", build, failed="inventory update", counted=False)

    def _rebuild(
        self, reason: str, done: str, build: _Build, *, failed: str = "config reload", counted: bool = True
    ) -> bool:
        with self.lock:
            old, session = self._current, self._session
            if old is None or session is None:
                return False  # nothing served yet (still starting, or NVML never opened)
            try:
                built = build(old, session)
                if built is old:
                    return True  # nothing to serve differently
                snapshot = self._check(built)
            except Exception as exc:  # whatever went wrong, the last good snapshot stays
                message = str(exc) if isinstance(exc, DevicePluginError) else f"{type(exc).__name__}: {exc}"
                line = f"{failed} ({reason}) rejected, {self._kept}: {message}"
                if not isinstance(exc, CdiError):
                    log.error("%s", line)
                elif message != self._cdi_rejection:
                    log.error("%s; retrying with backoff", line)
                self._cdi_rejection = message if isinstance(exc, CdiError) else None
                if counted:
                    self._on_result(False, message)
                if isinstance(exc, NvmlError | CdiError):
                    self.retry_later(reason, cdi=isinstance(exc, CdiError))
                return False
            self._retry_delay_s = self._retry_min_s
            self._cdi_rejection = None
            self._apply(snapshot, old)
            self._current = snapshot
            self._rediscover_if_unread(snapshot)
            log.info(
                "%s (%s): %s",
                done,
                reason,
                ", ".join(f"{p.name} x{len(p.devices)}" for p in snapshot.plans) or "no resources",
            )
            if counted:
                self._on_result(True, "")
            return True

    def _rediscover_if_unread(self, snapshot: Snapshot) -> None:
        """Re-discovery's thread, made for the first served snapshot with a GPU it could not read."""
        if _unread_gpus(snapshot.inventory):
            self.rediscovery.start_thread()

    def retry_later(self, reason: str, cdi: bool = False) -> None:
        """Reload again after the current backoff delay (which then doubles, up to the cap)."""
        delay = self._retry_delay_s
        if self.retry.schedule(delay, f"retry of: {reason}"):
            self._retry_delay_s = min(delay * 2, self._retry_max_s)
            if cdi:  # its one line said so already
                log.debug("retrying the config reload in %gs (CDI specs could not be made)", delay)
            else:
                log.info("retrying the config reload in %gs (NVML failed during discovery)", delay)


class Rediscovery(Worker):
    """The "gpu-rediscovery" thread: re-discovers the node when a GPU it could not read reads again.

    Covers the GPUs the served inventory holds as lost (GPU_IS_LOST or a stuck call while they were read,
    at start or on a reload) and those it could not even open; checks each through its NVML lane
    (nvml/events.py: probe, probe_index) and calls `follower.refresh`. A GPU that reads again but is
    still lost after that (it fails the longer read of discovery) backs off, doubling to
    REDISCOVERY_BACKOFF_MAX_S, so it cannot make the daemon rebuild its snapshot every few seconds. The
    thread is made when a served snapshot first holds such a GPU (most daemons never need it).
    """

    def __init__(self, follower: SnapshotFollower, interval_s: float) -> None:
        super().__init__("gpu-rediscovery")
        self._follower = follower
        self._interval_s = interval_s
        self._not_before: dict[int, tuple[float, float]] = {}  # GPU index -> (next check, its delay)
        self._failures = FailureLog(log)

    def setup(self) -> bool:
        snapshot = self._follower.current[0]
        return snapshot is not None and bool(_unread_gpus(snapshot.inventory))  # else made when one is

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self._interval_s):
            try:
                self.check()
            except Exception as exc:  # a bug must not end re-discovery: say so once per kind and go on
                self._failures.report_first(
                    f"bug {type(exc).__name__}", f"GPU re-discovery failed ({exc}); continuing", exc_info=True
                )

    def check(self) -> bool:
        """Re-discover now if a GPU that was unreadable reads again; True when a refresh was applied."""
        snapshot, session = self._follower.current
        if snapshot is None or session is None:
            return False
        now = time.monotonic()
        back = [
            i for i in _unread_gpus(snapshot.inventory) if self._due(i, now) and _reads(session, snapshot, i)
        ]
        if not back:
            return False
        reason = f"GPU {', '.join(map(str, back))} readable again"
        log.info("%s: re-discovering the node, so what was read of it while it was lost is replaced", reason)
        applied = self._follower.refresh(reason)
        current = self._follower.current[0] or snapshot
        still = set(_unread_gpus(current.inventory))
        for index in back:
            if index in still:
                self._back_off(index, now)
            else:
                self._not_before.pop(index, None)
        return applied

    def _due(self, index: int, now: float) -> bool:
        entry = self._not_before.get(index)
        return entry is None or now >= entry[0]

    def _back_off(self, index: int, now: float) -> None:
        delay = min(self._not_before.get(index, (0.0, self._interval_s))[1] * 2, REDISCOVERY_BACKOFF_MAX_S)
        self._not_before[index] = (now + delay, delay)


def _unread_gpus(inventory: Inventory) -> list[int]:
    """GPU indices discovery could not read whole: held as lost, or not opened for a lost or stuck GPU."""
    held = {gpu.index for gpu in inventory.gpus}
    lost = [gpu.index for gpu in inventory.gpus if gpu.lost]
    unopened = {
        p.gpu_index
        for p in inventory.problems
        if p.gpu_index is not None and p.gpu_index not in held and means_lost(p.code)
    }
    return sorted({*lost, *unopened})


def _reads(session: NvmlSession, snapshot: Snapshot, index: int) -> bool:
    gpu = next((g for g in snapshot.inventory.gpus if g.index == index), None)
    if gpu is None:
        return nvml_events.probe_index(session.nv, index)
    return nvml_events.probe(session.nv, gpu.uuid).state == "ok"


class ReloadRetry(Worker):
    """The "reload-retry" thread: calls `reload(reason)` once a scheduled retry is due.

    One retry waits at a time: a reload that fails while one is pending leaves it as it is; the retry,
    when it fails again, schedules the next one itself. The thread is made for the first retry (most
    daemons never need one).
    """

    def __init__(self, reload: Callable[[str], object]) -> None:
        super().__init__("reload-retry")
        self._reload = reload
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._due: tuple[float, str] | None = None  # (monotonic time, reason)

    def schedule(self, delay_s: float, reason: str) -> bool:
        """Reload in `delay_s`; False (and nothing changes) when a retry is pending already."""
        with self._lock:
            if self._due is not None:
                return False
            self._due = (time.monotonic() + delay_s, reason)
        self._wake.set()
        self.start_thread()  # the thread setup() put off, if this is the first retry
        return True

    def setup(self) -> bool:
        with self._lock:
            return self._due is not None  # a thread now only for a retry scheduled before the start

    def wake(self) -> None:
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._wake.clear()  # before reading _due, so a schedule() after the read is not slept through
            with self._lock:
                due = self._due
            if due is None or due[0] > time.monotonic():
                self._wake.wait(None if due is None else due[0] - time.monotonic())
                continue
            with self._lock:
                self._due = None
            try:
                self._reload(due[1])
            except Exception:  # a bug in applying a snapshot must not end the retries
                log.exception("config reload (%s) failed", due[1])

"""The one pipeline: an NVML session and a config -> the inventory -> the resource plans served.

Everything that needs "what would this node advertise" calls `build_snapshot`: the daemon at start and on
every reload, `plan`, `demo`, the benchmarks and the tests. A Snapshot is replaced whole, never mutated, so
a reader (a gRPC call, a scrape) always sees one consistent moment. Both daemons move from one snapshot to
the next through `SnapshotFollower` (at the end of this module).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from nvidia_device_plugin.base.errors import DevicePluginError, NvmlError
from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.base.workers import Worker
from nvidia_device_plugin.cdi.model import CdiError, CdiPlan
from nvidia_device_plugin.config.v1 import Config, any_cdi_enabled
from nvidia_device_plugin.devices import DiscoveryProblem, Inventory
from nvidia_device_plugin.nvml import events as nvml_events
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.errors import means_lost
from nvidia_device_plugin.nvml.host import HostPaths
from nvidia_device_plugin.nvml.session import NvmlSession
from nvidia_device_plugin.plans.device_lists import check_device_list_sizes
from nvidia_device_plugin.plans.mig_layout import MigLayoutViolation, mig_layout_violations
from nvidia_device_plugin.plans.resource_plans import build_resources
from nvidia_device_plugin.plans.resources import ResourcePlan
from nvidia_device_plugin.serving.allocate import AllocationSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """What is served right now: the config, what discovery found, and the plans built from both."""

    config: Config
    inventory: Inventory
    plans: tuple[ResourcePlan, ...]
    allocation: AllocationSettings
    mig_violations: tuple[MigLayoutViolation, ...] = ()  # GPUs left out for breaking flags.migStrategy
    cdi: CdiPlan | None = None  # the CDI specs a CDI device-list strategy needs; None without one


def build_snapshot(session: NvmlSession, config: Config, previous: Inventory | None = None) -> Snapshot:
    """Discover the node through `session` and expand it under `config`.

    `previous` is the inventory served until now (on a reload): a GPU it had that NVML can no longer even
    open (GPU_IS_LOST from nvmlDeviceGetHandleByIndex, so not even its UUID can be read) is carried over
    as lost, so that it stays advertised as Unhealthy instead of vanishing from kubelet's list.

    Raises NvmlError when discovery fails and ConfigError / InventoryError when the config cannot be
    applied to what was found.
    """
    inventory = discover(session.nv, session.host.sysfs_root, session.host.proc_root)
    if previous is not None:
        inventory = carry_over_lost(inventory, previous)
    violations = mig_layout_violations(inventory.gpus, config.flags.mig_strategy)
    plans = build_resources(inventory, config, violations)
    check_device_list_sizes(plans)
    cdi = _plan_cdi(inventory, plans, config, session.host)
    allocation = AllocationSettings.from_config(config, session.host, cdi)  # names what the CDI specs define
    return Snapshot(config, inventory, plans, allocation, violations, cdi)


def _plan_cdi(
    inventory: Inventory, plans: Sequence[ResourcePlan], config: Config, host: HostPaths
) -> CdiPlan | None:
    """cdi.spec.plan_cdi, whose node scan (and its modules) loads only under a CDI strategy: most nodes run
    without one, and importing it costs every start-up."""
    if not any_cdi_enabled(config.flags.plugin.device_list_strategy):
        return None
    from nvidia_device_plugin.cdi.spec import plan_cdi

    return plan_cdi(inventory, plans, config, host)


def carry_over_lost(inventory: Inventory, previous: Inventory) -> Inventory:
    """`inventory` with, marked lost and as `previous` knew them, the GPUs discovery could not read this
    time: those it could not even open (added), and those lost midway (GPU_IS_LOST, or a call stuck in
    the driver) that `previous` had read whole (their earlier facts kept: memory, PCI, MIG devices, links)."""
    inventory = _keep_earlier_facts(inventory, previous)
    indices = {gpu.index for gpu in inventory.gpus}
    failed = {p.gpu_index for p in inventory.problems if p.gpu_index is not None}
    missing = [
        replace(gpu, lost=True)
        for gpu in previous.gpus
        if gpu.index not in indices and gpu.index in failed and inventory.gpu(gpu.uuid) is None
    ]
    if not missing:
        return inventory
    kept = {gpu.index for gpu in missing}
    links = [*inventory.links, *(ln for ln in previous.links if ln.a in kept or ln.b in kept)]
    problems = [p for p in inventory.problems if p.gpu_index not in kept]
    problems += [
        DiscoveryProblem(
            gpu.index,
            next(p.call for p in inventory.problems if p.gpu_index == gpu.index),
            next(p.code for p in inventory.problems if p.gpu_index == gpu.index),
            f"{gpu.label} can no longer be read; still advertised, as Unhealthy "
            "(lost), with what was known of it before",
        )
        for gpu in missing
    ]
    return replace(
        inventory,
        gpus=tuple(sorted([*inventory.gpus, *missing], key=lambda gpu: gpu.index)),
        links=tuple(sorted(links, key=lambda ln: (ln.a, ln.b))),
        problems=tuple(problems),
    )


def _keep_earlier_facts(inventory: Inventory, previous: Inventory) -> Inventory:
    before = {gpu.uuid: gpu for gpu in previous.gpus if not gpu.lost}
    kept = {gpu.index: before[gpu.uuid] for gpu in inventory.gpus if gpu.lost and gpu.uuid in before}
    if not kept:
        return inventory
    gpus = tuple(replace(kept[g.index], lost=True) if g.index in kept else g for g in inventory.gpus)
    ours = {(ln.a, ln.b): ln for ln in previous.links if ln.a in kept or ln.b in kept}
    links = tuple(ours.get((ln.a, ln.b), ln) for ln in inventory.links)
    return replace(inventory, gpus=gpus, links=links)


# ---- the follower: how a running daemon moves from one snapshot to the next ---------------------------

# A reload rejected for a transient reason (NVML failing during discovery, the node's CDI files briefly
# unusable) is retried with this backoff.
RELOAD_RETRY_MIN_S = 1.0
RELOAD_RETRY_MAX_S = 60.0
# A GPU held as lost is checked this often (as often as health checks a GPU is readable); one that reads
# again but is still lost after the re-discovery is checked less often, up to REDISCOVERY_BACKOFF_MAX_S.
REDISCOVERY_INTERVAL_S = 5.0
REDISCOVERY_BACKOFF_MAX_S = 300.0

Apply = Callable[[Snapshot, Snapshot], None]  # (new, old): make the daemon act on `new` instead of `old`


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
      RELOAD_RETRY_MIN_S doubling to RELOAD_RETRY_MAX_S; a reload that lands resets the delay. So is one
      that `check` refused with a CdiError (a driver root or spec directory briefly unusable), whose
      rejection is logged once per distinct reason; `retry_later` asks for such a retry from outside;
    * reloads run one at a time, and the daemon's first serve holds `lock` too, so a change that lands
      during start-up waits for the first snapshot;
    * a GPU the snapshot holds as lost (or could not open) that NVML reads again is re-discovered: the
      "gpu-rediscovery" worker (the daemon owns it) checks those GPUs every `rediscovery_interval_s` and
      then `refresh`es, rebuilding the snapshot under the same config, so everything derived from the
      GPU (its memory and MPS limits, NUMA node, links, MIG devices, CDI specs, labels) follows.

    `check` may refuse a snapshot the daemon cannot serve (raising DevicePluginError); `apply(new, old)`
    makes the daemon act on it; `on_result(applied, message)` hears every outcome (metrics).
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
        self._retry_delay_s = RELOAD_RETRY_MIN_S
        self._cdi_rejection: str | None = None  # the CDI reason last logged (logged once per reason)

    def first(self, session: NvmlSession, config: Config) -> Snapshot:
        """The first snapshot, which the caller serves holding `lock`; raises as build_snapshot does."""
        snapshot = self._check(build_snapshot(session, config))
        self._session, self._current = session, snapshot
        return snapshot

    @property
    def current(self) -> tuple[Snapshot | None, NvmlSession | None]:
        """The snapshot served now and the session it was read through (None, None before the first)."""
        return self._current, self._session

    def reload(self, reason: str) -> bool:
        """Apply the config as it reads now; on any error keep the last good snapshot. True when applied."""
        return self._rebuild(reason, same_config=False)

    def refresh(self, reason: str) -> bool:
        """Read the node again under the config served now (a GPU came back); as reload() otherwise."""
        return self._rebuild(reason, same_config=True)

    def _rebuild(self, reason: str, same_config: bool) -> bool:
        with self.lock:
            old, session = self._current, self._session
            if old is None or session is None:
                return False  # nothing served yet (still starting, or NVML never opened)
            try:
                config = old.config if same_config else self._load_config()
                snapshot = self._check(build_snapshot(session, config, previous=old.inventory))
            except Exception as exc:  # whatever went wrong, the last good snapshot stays
                message = str(exc) if isinstance(exc, DevicePluginError) else f"{type(exc).__name__}: {exc}"
                line = f"config reload ({reason}) rejected, {self._kept}: {message}"
                if not isinstance(exc, CdiError):
                    log.error("%s", line)
                elif message != self._cdi_rejection:
                    log.error("%s; retrying with backoff", line)
                self._cdi_rejection = message if isinstance(exc, CdiError) else None
                self._on_result(False, message)
                if isinstance(exc, NvmlError | CdiError):
                    self.retry_later(reason, cdi=isinstance(exc, CdiError))
                return False
            self._retry_delay_s = RELOAD_RETRY_MIN_S
            self._cdi_rejection = None
            self._apply(snapshot, old)
            self._current = snapshot
            log.info(
                "%s (%s): %s",
                "node re-discovered" if same_config else "config reloaded",
                reason,
                ", ".join(f"{p.name} x{len(p.devices)}" for p in snapshot.plans) or "no resources",
            )
            self._on_result(True, "")
            return True

    def retry_later(self, reason: str, cdi: bool = False) -> None:
        """Reload again after the current backoff delay (which then doubles, up to the cap)."""
        delay = self._retry_delay_s
        if self.retry.schedule(delay, f"retry of: {reason}"):
            self._retry_delay_s = min(delay * 2, RELOAD_RETRY_MAX_S)
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
    REDISCOVERY_BACKOFF_MAX_S, so it cannot make the daemon rebuild its snapshot every few seconds.
    """

    def __init__(self, follower: SnapshotFollower, interval_s: float) -> None:
        super().__init__("gpu-rediscovery")
        self._follower = follower
        self._interval_s = interval_s
        self._not_before: dict[int, tuple[float, float]] = {}  # GPU index -> (next check, its delay)
        self._failures = FailureLog(log)

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
    when it fails again, schedules the next one itself.
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
        return True

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

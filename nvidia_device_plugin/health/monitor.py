"""NVML event loop -> health changes in a HealthRegistry.

One thread ("nvml-health") waits on an NVML event set for XID and double-bit ECC events, checks every
GPU is still readable every `poll_interval_s`, and, when recovery is on, brings devices back. It never
dies from an NVML error: a failing wait is logged once per distinct error code and retried with backoff.
Every XID seen, critical or not, is reported to `Events.xid_seen`. NVML is reached only through
nvml/events.py.

Decisions where NVIDIA's plugin (internal/rm/health.go) differs or is silent (XID attribution to MIG
devices: see health/policy.py):

* A failing wait does not mark every device unhealthy (NVIDIA's plugin does); it is retried, and a
  GPU_IS_LOST from it triggers an immediate liveness check of every GPU, which marks the lost ones.
* health.eventTypes selects what is registered, intersected with what each GPU supports. Single-bit
  ECC errors are corrected by the hardware and never change health, so they are not registered even
  when listed (NVIDIA registers them and then skips them).
* Every GPU is checked for liveness on each poll (handle by UUID, UUID, memory info), not only those
  without event support: a GPU that falls off the bus may raise no event at all. GPU_IS_LOST and
  NOT_FOUND (the driver no longer lists it) mean lost; any other failure (a transient UNKNOWN) is logged
  once and means lost only after LOST_AFTER_FAILED_PROBES consecutive failed checks.
* Registration failures other than GPU_IS_LOST leave the GPU healthy and polled (NVIDIA marks it
  unhealthy): a GPU that cannot report XIDs is not thereby broken.
* Recovery (health.recovery.enabled, off by default): a device becomes healthy again after
  grace_period_seconds without a new critical event on it, a successful NVML read of it, and nothing
  NVML can tell against it: no new uncorrectable ECC errors since the fault, no pending or failed row
  remapping, no GPU recovery action asked for (nvml/events.py:recovery_blocker). For a lost
  GPU the grace period starts only when a liveness check finds it readable again.
  With recovery off a GPU that comes back stays unhealthy: it lost every context on it when it fell
  off the bus, that usually means failing hardware (XID 79), and "unhealthy stays unhealthy until the
  plugin restarts" is the contract an operator chose by leaving recovery off. Its return is logged.
* A monitor started with a registry that already holds unhealthy devices of its inventory (a config
  reload replaced the previous monitor) takes them over: they stay unhealthy, and with recovery on
  their grace period starts at start().
* Ignored XIDs: the first in each minute is logged at INFO with its device; further ones that minute are
  counted and summed up in one line when the minute is over, so a storm costs two lines a minute.
* Events are handled one at a time as the wait returns them; nothing is queued here, so a storm costs
  time, not memory (NVML, or the simulator, holds what has not been read yet).
* stop() interrupts the event wait where the NVML API can (the simulator); real NVML's wait cannot be
  interrupted safely, so there stop() waits out the current wait (wait_timeout_ms, 500 ms by default).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from nvidia_device_plugin.config.v1 import Health
from nvidia_device_plugin.devices import Gpu, Inventory, describe
from nvidia_device_plugin.events import NO_EVENTS, Events, HealthChange
from nvidia_device_plugin.health.policy import REASON_DOUBLE_BIT_ECC, REASON_LOST, attribute_xid, xid_reason
from nvidia_device_plugin.health.registry import HealthRegistry
from nvidia_device_plugin.nvml import events as nvml_events
from nvidia_device_plugin.nvml.api import EventSetHandle, NvmlApi
from nvidia_device_plugin.nvml.events import HealthEvent, NvmlFailure, ProbeState

log = logging.getLogger(__name__)

_MAX_BACKOFF_S = 5.0
_IGNORED_LOG_WINDOW_S = 60.0
_MAX_DISTINCT_IGNORED = 32  # distinct XIDs counted per window; the rest are summed as "other"
_DRAIN_LIMIT = 10_000  # events read from an event set that is being replaced
_URGENT_CHECK_MIN_S = 1.0  # least time between out-of-turn liveness checks (a storm of unreadable events)
# Consecutive failed liveness probes (other than GPU_IS_LOST / NOT_FOUND) after which a GPU counts as lost:
# one transient NVML_ERROR_UNKNOWN must not take a GPU out for good.
LOST_AFTER_FAILED_PROBES = 3


@dataclass
class _Fault:
    """An unhealthy device this monitor marked; mutable, touched by the monitor thread only."""

    gpu: Gpu
    lost: bool  # the device was unreadable at the last check
    was_lost: bool  # it was unreadable at some point, so its event registration must be renewed
    last_bad_at: float  # last critical event, or last time seen lost
    next_probe_at: float = 0.0
    ecc_baseline: int | None = None  # uncorrectable ECC count when it was marked
    blocker: str | None = None  # the last reason recovery refused it (logged once per reason)


class _IgnoredXidLog:
    """Logs ignored XIDs without letting a storm of them flood the log."""

    def __init__(self, window_s: float = _IGNORED_LOG_WINDOW_S) -> None:
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


class HealthMonitor:
    """Watches the GPUs of `inventory` through `nv` (pynvml, or a SimulatedNvml) and marks `registry`.

    NVML must be initialised by the caller and stay so until stop() returns.
    """

    def __init__(
        self,
        nv: NvmlApi,
        inventory: Inventory,
        policy: Health,
        registry: HealthRegistry,
        *,
        wait_timeout_ms: int = 500,
        poll_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        events: Events = NO_EVENTS,
    ) -> None:
        self._nv = nv
        self._events = events
        self._inventory = inventory
        self._policy = policy
        self._registry = registry
        self._wait_timeout_ms = wait_timeout_ms
        self._poll_interval_s = poll_interval_s
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Replaced only by the monitor thread (and start() before it runs), so stop() may read it.
        self._event_set: EventSetHandle | None = None
        self._registered: set[str] = set()
        self._reported_polled: set[str] = set()
        self._faults: dict[str, _Fault] = {}
        self._failed_probes: dict[str, int] = {}
        self._ignored = _IgnoredXidLog()
        self._logged_errors: set[tuple[str, int | str]] = set()
        self._wait_failing = False
        self._backoff_s = self._initial_backoff_s
        self._next_poll_at = 0.0
        self._last_urgent_check: float | None = None
        self._wanted_events = nvml_events.event_mask(policy.event_types)

    @property
    def _initial_backoff_s(self) -> float:
        return max(self._wait_timeout_ms / 1000.0, 0.01)

    def start(self) -> None:
        """Register for events (in the caller's thread, so no event after start() is missed) and run."""
        if self._thread is not None:
            raise RuntimeError("HealthMonitor.start() called twice")
        if self._policy.disabled:
            log.info("health checks disabled by config (health.disabled): devices are always healthy")
            return
        self._adopt_unhealthy()
        self._build_event_set()
        self._next_poll_at = self._clock() + self._poll_interval_s
        log.info(
            "health monitor started: %d GPUs, %d watched for events, liveness checked every %gs, recovery %s",
            len(self._inventory.gpus),
            len(self._registered),
            self._poll_interval_s,
            f"after {self._policy.recovery.grace_period_seconds:g}s"
            if self._policy.recovery.enabled
            else "off",
        )
        self._thread = threading.Thread(target=self._run, name="nvml-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and free the event set; returns at once where the wait can be interrupted
        (simulation), else within about one wait timeout. Idempotent."""
        already_stopping = self._stop.is_set()
        self._stop.set()
        thread = self._thread
        if thread is None or (already_stopping and not thread.is_alive()):
            return
        # The thread checks _stop just before each wait, and only it replaces the event set: whichever
        # set it waits on after that check is the one read here, so the interrupt cannot miss it.
        event_set = self._event_set
        if event_set is not None:
            nvml_events.interrupt_wait(self._nv, event_set)
        thread.join(timeout=self._wait_timeout_ms / 1000.0 + 5.0)
        if thread.is_alive():
            log.warning("health monitor thread did not stop: an NVML call is hanging")
        else:
            log.info("health monitor stopped")

    def _adopt_unhealthy(self) -> None:
        """Take over devices a previous monitor (before a config reload) left unhealthy, so they recover."""
        now = self._clock()
        for uuid in self._registry.unhealthy():
            gpu = self._gpu_of(uuid)
            if gpu is not None:
                # A GPU lost at start-up (discovery) stays lost until a liveness check reads it.
                self._faults[uuid] = _Fault(gpu=gpu, lost=gpu.lost, was_lost=gpu.lost, last_bad_at=now)

    def _gpu_of(self, uuid: str) -> Gpu | None:
        """The GPU `uuid` is, or that the MIG device `uuid` sits on; None when not in the inventory."""
        gpu = self._inventory.gpu(uuid)
        if gpu is None:
            mig = self._inventory.mig_device(uuid)
            gpu = self._inventory.gpu(mig.parent_uuid) if mig is not None else None
        return gpu

    # ---- the loop ---------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._step()
                except Exception as exc:  # a bug must not silently end health checking
                    if self._first_time("bug", type(exc).__name__):
                        log.exception("health monitor step failed; continuing")
                    self._stop.wait(self._initial_backoff_s)
        finally:
            event_set, self._event_set = self._event_set, None
            self._registered = set()
            if event_set is not None:
                self._free(event_set)

    def _step(self) -> None:
        if self._registered:
            self._wait_once()
        else:
            self._stop.wait(self._wait_timeout_ms / 1000.0)
        now = self._clock()
        if now >= self._next_poll_at:
            self._next_poll_at = now + self._poll_interval_s
            self._check_liveness(now)
        if self._policy.recovery.enabled:
            self._recover(now)
        self._ignored.flush(now)

    def _wait_once(self) -> None:
        event_set = self._event_set
        if event_set is None or self._stop.is_set():  # see stop(): this check must precede the wait
            return
        try:
            event = nvml_events.wait_event(self._nv, event_set, self._wait_timeout_ms)
        except NvmlFailure as failure:
            self._wait_failed(failure)
            return
        self._wait_recovered()
        if event is not None:
            self._handle_event(event)

    def _wait_failed(self, failure: NvmlFailure) -> None:
        if self._first_time("wait", failure.code):
            log.warning("waiting for NVML events failed: %s; retrying", failure)
        self._wait_failing = True
        if failure.gpu_is_lost:
            newly_lost = self._urgent_liveness_check(self._clock())
            if newly_lost & self._registered:
                # A lost GPU cannot be taken out of an event set, and may keep failing the wait.
                self._build_event_set()
        self._stop.wait(self._backoff_s)
        self._backoff_s = min(self._backoff_s * 2, _MAX_BACKOFF_S)

    def _wait_recovered(self) -> None:
        if self._wait_failing:
            log.info("waiting for NVML events works again")
            self._wait_failing = False
            self._logged_errors = {k for k in self._logged_errors if k[0] != "wait"}
        self._backoff_s = self._initial_backoff_s

    def _handle_event(self, event: HealthEvent) -> None:
        now = self._clock()
        if event.gpu_uuid is None:
            failure = event.uuid_failure
            if self._first_time("event-uuid", failure.code if failure else 0):
                log.warning("cannot tell which GPU an NVML event came from: %s; checking all GPUs", failure)
            self._urgent_liveness_check(now)
            return
        gpu = self._inventory.gpu(event.gpu_uuid)
        if gpu is None:
            if len(self._logged_errors) < 1024 and self._first_time("unknown-device", event.gpu_uuid):
                log.info("ignoring NVML events from %s: not in this plugin's inventory", event.gpu_uuid)
            return
        if event.kind == "double-bit-ecc":
            self._fault(gpu, gpu.uuid, REASON_DOUBLE_BIT_ECC, None, now)
        elif event.kind == "xid" and event.xid is not None:
            critical = self._policy.is_critical(event.xid)
            self._events.xid_seen(gpu.uuid, event.xid, critical)
            if not critical:
                self._ignored.record(now, describe(self._inventory, gpu.uuid), event.xid)
                return
            for uuid in attribute_xid(gpu, event.gpu_instance_id, event.compute_instance_id):
                self._fault(gpu, uuid, xid_reason(event.xid), event.xid, now)

    # ---- marking and recovery ---------------------------------------------------------------------

    def _fault(
        self, gpu: Gpu, uuid: str, reason: str, xid: int | None, now: float, lost: bool = False
    ) -> None:
        fault = self._faults.get(uuid)
        if fault is None:
            self._faults[uuid] = _Fault(
                gpu=gpu,
                lost=lost,
                was_lost=lost,
                last_bad_at=now,
                ecc_baseline=nvml_events.uncorrected_ecc(self._nv, gpu.uuid),
            )
        else:
            fault.last_bad_at = now
            fault.lost = fault.lost or lost
            fault.was_lost = fault.was_lost or lost
        if self._registry.mark(HealthChange(uuid=uuid, healthy=False, reason=reason, xid=xid)):
            # DEBUG: the registry's subscriber (the daemon) logs the one line, with the resources affected.
            log.debug("%s is unhealthy: %s", describe(self._inventory, uuid), reason)

    def _recover(self, now: float) -> None:
        grace = self._policy.recovery.grace_period_seconds
        for uuid, fault in list(self._faults.items()):
            if fault.lost or now - fault.last_bad_at < grace or now < fault.next_probe_at:
                continue
            if self._probe(uuid, fault.gpu) != "ok":
                fault.next_probe_at = now + self._poll_interval_s
                continue
            blocker = nvml_events.recovery_blocker(self._nv, fault.gpu.uuid, fault.ecc_baseline)
            if blocker is not None:
                fault.next_probe_at = now + self._poll_interval_s
                if blocker != fault.blocker:
                    fault.blocker = blocker
                    log.warning("%s stays unhealthy: %s", describe(self._inventory, uuid), blocker)
                continue
            del self._faults[uuid]
            if self._registry.mark(HealthChange(uuid=uuid, healthy=True, reason="recovered")):
                log.debug(
                    "%s is healthy again: no critical event for %gs, NVML reads it, and no ECC, row "
                    "remapping or recovery-action fault",
                    describe(self._inventory, uuid),
                    grace,
                )
            if fault.was_lost:
                self._build_event_set()

    def _urgent_liveness_check(self, now: float) -> set[str]:
        """A liveness check out of turn, at most once per _URGENT_CHECK_MIN_S."""
        if self._last_urgent_check is not None and now - self._last_urgent_check < _URGENT_CHECK_MIN_S:
            return set()
        self._last_urgent_check = now
        return self._check_liveness(now)

    def _check_liveness(self, now: float) -> set[str]:
        """Probe each GPU; mark the unreadable ones lost. Returns the UUIDs newly found lost."""
        newly_lost: set[str] = set()
        for gpu in self._inventory.gpus:
            fault = self._faults.get(gpu.uuid)
            result = self._probe(gpu.uuid, gpu)
            if result == "unknown":
                failures = self._failed_probes.get(gpu.uuid, 0) + 1
                self._failed_probes[gpu.uuid] = failures
                if failures >= LOST_AFTER_FAILED_PROBES:
                    result = "lost"
            else:
                self._failed_probes.pop(gpu.uuid, None)
            if result == "lost":
                if fault is None or not fault.lost:
                    newly_lost.add(gpu.uuid)
                self._fault(gpu, gpu.uuid, REASON_LOST, None, now, lost=True)
            elif result == "ok" and fault is not None and fault.lost:
                fault.lost = False
                fault.last_bad_at = now
                if self._policy.recovery.enabled:
                    after = (
                        "still unhealthy; it returns to service after "
                        f"{self._policy.recovery.grace_period_seconds:g}s without faults if its ECC, "
                        "row remapping and recovery-action checks pass"
                    )
                else:
                    after = "it stays unhealthy, as health.recovery is off"
                log.info("%s is readable again; %s", describe(self._inventory, gpu.uuid), after)
        return newly_lost

    def _probe(self, uuid: str, gpu: Gpu) -> ProbeState:
        """Whether NVML can read the device now (a MIG device through its parent GPU)."""
        mig = self._inventory.mig_device(uuid)
        result = nvml_events.probe(self._nv, gpu.uuid, (mig.index, mig.uuid) if mig is not None else None)
        if result.failure is not None and self._first_time("probe", result.failure.code):
            log.warning("cannot check %s: %s", describe(self._inventory, uuid), result.failure)
        return result.state

    # ---- the event set ----------------------------------------------------------------------------

    def _build_event_set(self) -> None:
        """(Re)create the event set with every GPU not known lost.

        The new set is registered before the old one is drained and freed, so an event raised meanwhile
        reaches at least one of them (perhaps both: marking twice changes nothing).
        """
        if not self._wanted_events:
            if self._first_time("no-events", 0):
                log.warning(
                    "health.eventTypes %s selects no XID or double-bit ECC events: only checking GPUs are "
                    "readable every %gs",
                    list(self._policy.event_types),
                    self._poll_interval_s,
                )
            return
        try:
            new_set = nvml_events.create_event_set(self._nv)
        except NvmlFailure as failure:
            if self._first_time("create", failure.code):
                log.warning(
                    "cannot create an NVML event set: %s; %s",
                    failure,
                    "keeping the old one"
                    if self._event_set is not None
                    else f"XIDs will not be seen, only lost GPUs (checked every {self._poll_interval_s:g}s)",
                )
            return
        old_set, self._event_set = self._event_set, new_set
        self._registered = set()
        for gpu in self._inventory.gpus:
            fault = self._faults.get(gpu.uuid)
            if fault is None or not fault.lost:
                self._register(gpu, new_set)
        if old_set is not None:
            for event in nvml_events.drain_events(self._nv, old_set, _DRAIN_LIMIT):
                self._handle_event(event)
            self._free(old_set)

    def _register(self, gpu: Gpu, event_set: EventSetHandle) -> None:
        try:
            mask = nvml_events.register_gpu(self._nv, event_set, gpu.uuid, self._wanted_events)
        except NvmlFailure as failure:
            if failure.means_lost:
                self._fault(gpu, gpu.uuid, REASON_LOST, None, self._clock(), lost=True)
            elif failure.not_supported:
                self._report_polled(gpu, "it supports no health events")
            elif failure.no_permission and gpu.mig_enabled:
                self._report_polled(
                    gpu,
                    "NO_PERMISSION: XIDs of MIG instances cannot be attributed without CAP_SYS_ADMIN "
                    "in the container",
                )
            else:
                self._report_polled(gpu, f"registering for events failed: {failure}")
            return
        if not mask:
            self._report_polled(gpu, "it supports no health events")
            return
        self._registered.add(gpu.uuid)

    def _report_polled(self, gpu: Gpu, why: str) -> None:
        if gpu.uuid not in self._reported_polled:
            self._reported_polled.add(gpu.uuid)
            log.warning(
                "%s: XIDs cannot be watched (%s); only checking it is readable every %gs",
                describe(self._inventory, gpu.uuid),
                why,
                self._poll_interval_s,
            )

    def _free(self, event_set: EventSetHandle) -> None:
        try:
            nvml_events.free_event_set(self._nv, event_set)
        except NvmlFailure as failure:
            log.warning("freeing an NVML event set failed: %s", failure)

    def _first_time(self, kind: str, key: int | str) -> bool:
        if (kind, key) in self._logged_errors:
            return False
        self._logged_errors.add((kind, key))
        return True

"""NVML event loop -> health changes in a HealthRegistry.

One worker ("nvml-health") waits on an NVML event set for XID and double-bit ECC events, checks every
GPU is still readable every `poll_interval_s`, and, when recovery is on, brings devices back (the faults,
liveness checks and recovery are health/faults.py; ignored XIDs are logged by health/ignored.py). It never
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
* Events are read in batches of at most _BATCH (the next one and those queued behind it) and handled one
  at a time; nothing more is queued here, so a storm costs time, not memory (NVML, or the simulator,
  holds what has not been read yet).
* NVML calls have deadlines (nvml/bounded.py): a GPU whose call does not return is marked unhealthy at
  once, with the call in its reason ("NVML call nvmlDeviceGetMemoryInfo stuck"), and checked again every
  poll; the other GPUs' checks, and the event wait, go on meanwhile.
* When such a stuck call returns at last, every GPU is checked at the next step rather than at the next
  poll, so a GPU released by the driver comes back (with recovery on) as promptly as one never stuck.
* stop() interrupts the event wait where the NVML API can (the simulator); real NVML's wait cannot be
  interrupted safely, so there stop() waits out the current wait (wait_timeout_ms, 500 ms by default).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.base.workers import Worker
from nvidia_device_plugin.config.v1 import Health
from nvidia_device_plugin.devices import Gpu, Inventory
from nvidia_device_plugin.events import NO_EVENTS, Events
from nvidia_device_plugin.health.faults import LOST_AFTER_FAILED_PROBES, FaultTracker, HealthScope
from nvidia_device_plugin.health.ignored import IgnoredXidLog
from nvidia_device_plugin.health.policy import DOUBLE_BIT_ECC, attribute_xid, xid_cause
from nvidia_device_plugin.health.registry import HealthRegistry
from nvidia_device_plugin.nvml import events as nvml_events
from nvidia_device_plugin.nvml.api import EventSetHandle, NvmlApi
from nvidia_device_plugin.nvml.events import HealthEvent, NvmlFailure

__all__ = ["LOST_AFTER_FAILED_PROBES", "HealthMonitor"]

log = logging.getLogger(__name__)

_MAX_BACKOFF_S = 5.0
_DRAIN_LIMIT = 10_000  # events read from an event set that is being replaced
_BATCH = 256  # events read per wait: the next event and those queued behind it
_URGENT_CHECK_MIN_S = 1.0  # least time between out-of-turn liveness checks (a storm of unreadable events)
_MAX_FAILURES_KEPT = 1024  # bounds the "once per distinct reason" memory against foreign device UUIDs


class HealthMonitor(Worker):
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
        super().__init__("nvml-health")
        # stop() waits out one real NVML wait, which cannot be interrupted (see the module doc).
        self.join_timeout_s = wait_timeout_ms / 1000.0 + 5.0
        self._scope = HealthScope(nv, inventory, policy, clock, poll_interval_s)
        self._nv = nv  # these three are the scope's, by shorter names: read on every step
        self._inventory = inventory
        self._policy = policy
        self._events = events
        self._wait_timeout_ms = wait_timeout_ms
        # Replaced only by the monitor thread (and start() before it runs), so stop() may read it.
        self._event_set: EventSetHandle | None = None
        self._registered: set[str] = set()
        self._failures = FailureLog(log)  # each distinct problem logged once
        self._wait_failures = FailureLog(log)  # the event wait's, forgotten when it works again
        self._faults = FaultTracker(self._scope, registry, self._failures)
        self._ignored = IgnoredXidLog()
        self._backoff_s = self._initial_backoff_s
        self._next_poll_at = 0.0
        self._last_urgent_check: float | None = None
        self._wanted_events = nvml_events.event_mask(policy.event_types)
        self._recheck = threading.Event()  # a stuck NVML call returned: check liveness at the next step
        self._unwatch_returns: Callable[[], None] | None = None

    @property
    def _initial_backoff_s(self) -> float:
        return max(self._wait_timeout_ms / 1000.0, 0.01)

    # ---- lifecycle (workers.Worker) -----------------------------------------------------------------

    def setup(self) -> bool:
        """Register for events in start()'s caller, so no event after start() is missed."""
        if self._policy.disabled:
            log.info("health checks disabled by config (health.disabled): devices are always healthy")
            return False
        self._faults.adopt_unhealthy()
        self._unwatch_returns = nvml_events.on_stuck_call_returned(self._nv, self._recheck.set)
        self._build_event_set()
        self._next_poll_at = self._scope.clock() + self._scope.poll_interval_s
        log.info(
            "health monitor started: %d GPUs, %d watched for events, liveness checked every %gs, recovery %s",
            len(self._inventory.gpus),
            len(self._registered),
            self._scope.poll_interval_s,
            f"after {self._policy.recovery.grace_period_seconds:g}s"
            if self._policy.recovery.enabled
            else "off",
        )
        return True

    def wake(self) -> None:
        """Interrupt the event wait where the NVML API can (the simulator).

        The thread checks the stop event just before each wait, and only it replaces the event set:
        whichever set it waits on after that check is the one read here, so the interrupt cannot miss it.
        """
        event_set = self._event_set
        if event_set is not None and self.alive:
            nvml_events.interrupt_wait(self._nv, event_set)

    def cleanup(self) -> None:
        if self._unwatch_returns is not None:
            self._unwatch_returns()
        if not self.started or self._policy.disabled:
            return
        if self.alive:
            return  # left behind in an NVML call (logged); it frees its event set if it ever returns
        event_set, self._event_set = self._event_set, None
        if event_set is not None:  # the thread never ran (a failed start)
            self._free(event_set)
        log.info("health monitor stopped")

    # ---- the loop ---------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    self._step()
                except Exception as exc:  # a bug must not silently end health checking
                    self._failures.report_first(  # once per kind of bug, whatever its message
                        f"bug {type(exc).__name__}",
                        f"health monitor step failed ({type(exc).__name__}: {exc}); continuing",
                        logging.ERROR,
                        exc_info=True,
                    )
                    stop.wait(self._initial_backoff_s)
        finally:
            event_set, self._event_set = self._event_set, None
            self._registered = set()
            if event_set is not None:
                self._free(event_set)

    def _step(self) -> None:
        if self._registered:
            self._wait_once()
        else:
            self.stopping.wait(self._wait_timeout_ms / 1000.0)
        now = self._scope.clock()
        if now >= self._next_poll_at or self._recheck.is_set():
            self._recheck.clear()
            self._next_poll_at = now + self._scope.poll_interval_s
            self._faults.check_liveness(now)
        if self._policy.recovery.enabled and self._faults.recover(now):
            self._build_event_set()  # a GPU that had been lost is back: register it for events again
        self._ignored.flush(now)

    def _wait_once(self) -> None:
        event_set = self._event_set
        if event_set is None or self.stopping.is_set():  # see wake(): this check must precede the wait
            return
        try:
            events = nvml_events.wait_events(self._nv, event_set, self._wait_timeout_ms, _BATCH)
        except NvmlFailure as failure:
            self._wait_failed(failure)
            return
        if self._wait_failures.clear_all():
            log.info("waiting for NVML events works again")
        self._backoff_s = self._initial_backoff_s
        for event in events:
            self._handle_event(event)

    def _wait_failed(self, failure: NvmlFailure) -> None:
        if failure.shutting_down:  # the daemon is stopping: this monitor is about to be stopped too
            self.stopping.wait(self._backoff_s)
            return
        self._wait_failures.report(
            f"wait {failure.code}", f"waiting for NVML events failed: {failure}; retrying"
        )
        if failure.gpu_is_lost:
            newly_lost = self._urgent_liveness_check(self._scope.clock())
            if newly_lost & self._registered:
                # A lost GPU cannot be taken out of an event set, and may keep failing the wait.
                self._build_event_set()
        self.stopping.wait(self._backoff_s)
        self._backoff_s = min(self._backoff_s * 2, _MAX_BACKOFF_S)

    def _handle_event(self, event: HealthEvent) -> None:
        now = self._scope.clock()
        if event.gpu_uuid is None:
            failure = event.uuid_failure
            self._failures.report(
                f"event-uuid {failure.code if failure else 0}",
                f"cannot tell which GPU an NVML event came from: {failure}; checking all GPUs",
            )
            self._urgent_liveness_check(now)
            return
        gpu = self._inventory.gpu(event.gpu_uuid)
        if gpu is None:
            if len(self._failures) < _MAX_FAILURES_KEPT:
                self._failures.report(
                    f"unknown-device {event.gpu_uuid}",
                    f"ignoring NVML events from {event.gpu_uuid}: not in this plugin's inventory",
                    logging.INFO,
                )
            return
        if event.kind == "double-bit-ecc":
            self._faults.fault(gpu, gpu.uuid, DOUBLE_BIT_ECC, now)
        elif event.kind == "xid" and event.xid is not None:
            critical = self._policy.is_critical(event.xid)
            self._events.xid_seen(gpu.uuid, event.xid, critical)
            if not critical:
                self._ignored.record(now, gpu.label, event.xid)
                return
            for uuid in attribute_xid(gpu, event.gpu_instance_id, event.compute_instance_id):
                self._faults.fault(gpu, uuid, xid_cause(event.xid), now)

    def _urgent_liveness_check(self, now: float) -> set[str]:
        """A liveness check out of turn, at most once per _URGENT_CHECK_MIN_S."""
        if self._last_urgent_check is not None and now - self._last_urgent_check < _URGENT_CHECK_MIN_S:
            return set()
        self._last_urgent_check = now
        return self._faults.check_liveness(now)

    # ---- the event set ----------------------------------------------------------------------------

    def _build_event_set(self) -> None:
        """(Re)create the event set with every GPU not known lost.

        The new set is registered before the old one is drained and freed, so an event raised meanwhile
        reaches at least one of them (perhaps both: marking twice changes nothing).
        """
        if not self._wanted_events:
            self._failures.report(
                "no-events",
                f"health.eventTypes {list(self._policy.event_types)} selects no XID or double-bit ECC "
                f"events: only checking GPUs are readable every {self._scope.poll_interval_s:g}s",
            )
            return
        try:
            new_set = nvml_events.create_event_set(self._nv)
        except NvmlFailure as failure:
            without = (
                f"XIDs will not be seen, only lost GPUs (checked every {self._scope.poll_interval_s:g}s)"
            )
            self._failures.report_first(
                f"create {failure.code}",
                f"cannot create an NVML event set: {failure}; "
                + ("keeping the old one" if self._event_set is not None else without),
            )
            return
        old_set, self._event_set = self._event_set, new_set
        self._registered = set()
        for gpu in self._inventory.gpus:
            if not self._faults.is_lost(gpu.uuid):
                self._register(gpu, new_set)
        if old_set is not None:
            for event in nvml_events.drain_events(self._nv, old_set, _DRAIN_LIMIT):
                self._handle_event(event)
            self._free(old_set)

    def _register(self, gpu: Gpu, event_set: EventSetHandle) -> None:
        try:
            mask = nvml_events.register_gpu(self._nv, event_set, gpu.uuid, self._wanted_events)
        except NvmlFailure as failure:
            if failure.stuck:
                self._faults.mark_lost(gpu, self._scope.clock(), failure.call)
            elif failure.means_lost:
                self._faults.mark_lost(gpu, self._scope.clock())
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
        self._failures.report_first(
            f"polled {gpu.uuid}",
            f"{gpu.label}: XIDs cannot be watched ({why}); only checking it is readable every "
            f"{self._scope.poll_interval_s:g}s",
        )

    def _free(self, event_set: EventSetHandle) -> None:
        try:
            nvml_events.free_event_set(self._nv, event_set)
        except NvmlFailure as failure:
            if not failure.shutting_down:  # stopping: the driver frees it with the process
                log.warning("freeing an NVML event set failed: %s", failure)

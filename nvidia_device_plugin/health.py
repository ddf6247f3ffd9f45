"""NVML event loop -> health changes in a HealthRegistry.

One thread ("nvml-health") waits on an NVML event set for XID and double-bit ECC events, checks every
GPU is still readable every `poll_interval_s`, and, when recovery is on, brings devices back. It never
dies from an NVML error: a failing wait is logged once per distinct error code and retried with backoff.

Decisions where NVIDIA's plugin (internal/rm/health.go) differs or is silent:

* A failing wait does not mark every device unhealthy (NVIDIA's plugin does); it is retried, and a
  GPU_IS_LOST from it triggers an immediate liveness check of every GPU, which marks the lost ones.
* health.eventTypes selects what is registered, intersected with what each GPU supports. Single-bit
  ECC errors are corrected by the hardware and never change health, so they are not registered even
  when listed (NVIDIA registers them and then skips them).
* Every GPU is checked for liveness on each poll (handle by UUID, UUID, memory info), not only those
  without event support: a GPU that falls off the bus may raise no event at all. GPU_IS_LOST, UNKNOWN and
  NOT_FOUND (the driver no longer lists it) mean lost; other errors are logged once and change nothing.
* Registration failures other than GPU_IS_LOST leave the GPU healthy and polled (NVIDIA marks it
  unhealthy): a GPU that cannot report XIDs is not thereby broken.
* MIG attribution: an XID whose gpuInstanceId and computeInstanceId name one MIG device marks that MIG
  device; one with only a known gpuInstanceId marks the MIG devices of that GPU instance (they share
  its memory and SMs); anything else, including IDs matching no MIG device, marks the whole GPU.
  Double-bit ECC errors always mark the whole GPU.
* Recovery (health.recovery.enabled, off by default): a device becomes healthy again after
  grace_period_seconds without a new critical event on it and a successful NVML read of it. For a lost
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
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import pynvml

from nvidia_device_plugin.config.v1 import Health
from nvidia_device_plugin.devices import Gpu, Inventory, MigDevice
from nvidia_device_plugin.events import HealthChange
from nvidia_device_plugin.health_state import HealthRegistry

log = logging.getLogger(__name__)

REASON_LOST = "GPU lost"
REASON_DOUBLE_BIT_ECC = "double-bit ECC error"

NOT_ATTRIBUTED = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of an event not tied to a MIG instance
# health.eventTypes names -> the NVML event bits that can change health. Single-bit ECC errors are
# corrected by the hardware, so that name is accepted (NVIDIA's default list has it) but never registered.
EVENT_TYPE_BITS = {
    "EventTypeXidCriticalError": pynvml.nvmlEventTypeXidCriticalError,
    "EventTypeDoubleBitEccError": pynvml.nvmlEventTypeDoubleBitEccError,
    "EventTypeSingleBitEccError": 0,
}
LOST_ERRORS = frozenset(
    {pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_NOT_FOUND}
)

_MAX_BACKOFF_S = 5.0
_IGNORED_LOG_WINDOW_S = 60.0
_MAX_DISTINCT_IGNORED = 32  # distinct XIDs counted per window; the rest are summed as "other"
_DRAIN_LIMIT = 10_000  # events read from an event set that is being replaced
_URGENT_CHECK_MIN_S = 1.0  # least time between out-of-turn liveness checks (a storm of unreadable events)

# Names of XIDs an operator is likely to meet, from NVIDIA's XID catalogue, for log lines only.
_XID_NAMES = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    68: "video processor exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def xid_reason(xid: int) -> str:
    """The reason string recorded for a critical XID, e.g. "XID 79 (GPU has fallen off the bus)"."""
    name = _XID_NAMES.get(xid)
    return f"XID {xid} ({name})" if name else f"XID {xid}"


def attribute_xid(gpu: Gpu, gpu_instance_id: int, compute_instance_id: int) -> list[str]:
    """UUIDs an XID on `gpu` with these instance IDs makes unhealthy (see the module docstring)."""
    if not gpu.mig_devices or gpu_instance_id == NOT_ATTRIBUTED:
        return [gpu.uuid]
    in_instance = [m for m in gpu.mig_devices if m.gpu_instance_id == gpu_instance_id]
    if compute_instance_id != NOT_ATTRIBUTED:
        in_instance = [m for m in in_instance if m.compute_instance_id == compute_instance_id]
    return [m.uuid for m in in_instance] or [gpu.uuid]


Probe = Literal["ok", "lost", "unknown"]


@dataclass
class _Fault:
    """An unhealthy device this monitor marked; mutable, touched by the monitor thread only."""

    gpu: Gpu
    lost: bool  # the device was unreadable at the last check
    was_lost: bool  # it was unreadable at some point, so its event registration must be renewed
    last_bad_at: float  # last critical event, or last time seen lost
    next_probe_at: float = 0.0


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
        nv: Any,  # the pynvml module or a SimulatedNvml: pynvml's untyped API either way
        inventory: Inventory,
        policy: Health,
        registry: HealthRegistry,
        *,
        wait_timeout_ms: int = 500,
        poll_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        on_xid: Callable[[str, int, bool], None] | None = None,
    ) -> None:
        self._nv = nv
        self._on_xid = on_xid  # f(gpu_uuid, xid, critical) for every XID seen, ignored ones too (metrics)
        self._inventory = inventory
        self._policy = policy
        self._registry = registry
        self._wait_timeout_ms = wait_timeout_ms
        self._poll_interval_s = poll_interval_s
        self._clock = clock
        self._by_uuid = {g.uuid: g for g in inventory.gpus}
        self._labels = _labels(inventory)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._registered: set[str] = set()
        self._reported_polled: set[str] = set()
        self._faults: dict[str, _Fault] = {}
        self._ignored = _IgnoredXidLog()
        self._logged_errors: set[tuple[str, int | str]] = set()
        self._wait_failing = False
        self._backoff_s = self._initial_backoff_s
        self._next_poll_at = 0.0
        self._last_urgent_check: float | None = None
        self._processed = 0
        self._wanted_events = 0
        for name in policy.event_types:
            self._wanted_events |= EVENT_TYPE_BITS.get(name, 0)

    @property
    def processed_events(self) -> int:
        """Events read from NVML so far (for metrics; read without locking, so approximate)."""
        return self._processed

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
        """Stop the thread and free the event set; returns within about one wait timeout. Idempotent."""
        already_stopping = self._stop.is_set()
        self._stop.set()
        thread = self._thread
        if thread is None or (already_stopping and not thread.is_alive()):
            return
        thread.join(timeout=self._wait_timeout_ms / 1000.0 + 5.0)
        if thread.is_alive():
            log.warning("health monitor thread did not stop: an NVML call is hanging")
        else:
            log.info("health monitor stopped")

    def _adopt_unhealthy(self) -> None:
        """Take over devices a previous monitor (before a config reload) left unhealthy, so they recover."""
        now = self._clock()
        for uuid in self._registry.unhealthy():
            if uuid in self._by_uuid:
                gpu: Gpu | None = self._by_uuid[uuid]
            else:
                mig = self._inventory.mig_device(uuid)
                gpu = self._by_uuid.get(mig.parent_uuid) if mig is not None else None
            if gpu is not None:
                self._faults[uuid] = _Fault(gpu=gpu, lost=False, was_lost=False, last_bad_at=now)

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
        try:
            data = self._nv.nvmlEventSetWait_v2(self._event_set, self._wait_timeout_ms)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_TIMEOUT:
                self._wait_recovered()
            else:
                self._wait_failed(exc)
            return
        self._wait_recovered()
        self._handle_event(data)

    def _wait_failed(self, exc: pynvml.NVMLError) -> None:
        code = int(exc.value)
        if self._first_time("wait", code):
            log.warning("waiting for NVML events failed: %s (NVML error %d); retrying", exc, code)
        self._wait_failing = True
        if code == pynvml.NVML_ERROR_GPU_IS_LOST:
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

    def _handle_event(self, data: Any) -> None:
        self._processed += 1
        now = self._clock()
        try:
            uuid = _text(self._nv.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError as exc:
            if self._first_time("event-uuid", int(exc.value)):
                log.warning(
                    "cannot tell which GPU an NVML event came from: %s (NVML error %d); checking all GPUs",
                    exc,
                    exc.value,
                )
            self._urgent_liveness_check(now)
            return
        gpu = self._by_uuid.get(uuid)
        if gpu is None:
            if len(self._logged_errors) < 1024 and self._first_time("unknown-device", uuid):
                log.info("ignoring NVML events from %s: not in this plugin's inventory", uuid)
            return
        event_type = int(data.eventType)
        if event_type & pynvml.nvmlEventTypeDoubleBitEccError:
            self._fault(gpu, gpu.uuid, REASON_DOUBLE_BIT_ECC, None, now)
        elif event_type & pynvml.nvmlEventTypeXidCriticalError:
            xid = int(data.eventData)
            if self._on_xid is not None:
                self._on_xid(gpu.uuid, xid, self._policy.is_critical(xid))
            if not self._policy.is_critical(xid):
                self._ignored.record(now, self._labels[gpu.uuid], xid)
                return
            for uuid in attribute_xid(gpu, int(data.gpuInstanceId), int(data.computeInstanceId)):
                self._fault(gpu, uuid, xid_reason(xid), xid, now)

    # ---- marking and recovery ---------------------------------------------------------------------

    def _fault(
        self, gpu: Gpu, uuid: str, reason: str, xid: int | None, now: float, lost: bool = False
    ) -> None:
        fault = self._faults.get(uuid)
        if fault is None:
            self._faults[uuid] = _Fault(gpu=gpu, lost=lost, was_lost=lost, last_bad_at=now)
        else:
            fault.last_bad_at = now
            fault.lost = fault.lost or lost
            fault.was_lost = fault.was_lost or lost
        if self._registry.mark(HealthChange(uuid=uuid, healthy=False, reason=reason, xid=xid)):
            # DEBUG: the registry's subscriber (the daemon) logs the one line, with the resources affected.
            log.debug("%s is unhealthy: %s", self._labels[uuid], reason)

    def _recover(self, now: float) -> None:
        grace = self._policy.recovery.grace_period_seconds
        for uuid, fault in list(self._faults.items()):
            if fault.lost or now - fault.last_bad_at < grace or now < fault.next_probe_at:
                continue
            if self._probe(uuid, fault.gpu) != "ok":
                fault.next_probe_at = now + self._poll_interval_s
                continue
            del self._faults[uuid]
            if self._registry.mark(HealthChange(uuid=uuid, healthy=True, reason="recovered")):
                log.debug(
                    "%s is healthy again: no critical event for %gs and NVML reads it",
                    self._labels[uuid],
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
            if result == "lost":
                if fault is None or not fault.lost:
                    newly_lost.add(gpu.uuid)
                self._fault(gpu, gpu.uuid, REASON_LOST, None, now, lost=True)
            elif result == "ok" and fault is not None and fault.lost:
                fault.lost = False
                fault.last_bad_at = now
                if self._policy.recovery.enabled:
                    after = f"healthy after {self._policy.recovery.grace_period_seconds:g}s without faults"
                else:
                    after = "unhealthy, as health.recovery is off"
                log.info("%s is readable again; it stays %s", self._labels[gpu.uuid], after)
        return newly_lost

    def _probe(self, uuid: str, gpu: Gpu) -> Probe:
        """Whether NVML can read the device now (a MIG device through its parent GPU)."""
        nv = self._nv
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(gpu.uuid)
            if _text(nv.nvmlDeviceGetUUID(handle)) != gpu.uuid:
                return "lost"
            try:
                nv.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError as exc:
                if exc.value != pynvml.NVML_ERROR_NOT_SUPPORTED:
                    raise
            mig = _mig(gpu, uuid)
            if mig is not None:
                mig_handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig.index)
                if _text(nv.nvmlDeviceGetUUID(mig_handle)) != mig.uuid:
                    return "lost"
        except pynvml.NVMLError as exc:
            if exc.value in LOST_ERRORS:
                return "lost"
            if self._first_time("probe", int(exc.value)):
                log.warning("cannot check %s: %s (NVML error %d)", self._labels[uuid], exc, exc.value)
            return "unknown"
        return "ok"

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
            new_set = self._nv.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            if self._first_time("create", int(exc.value)):
                log.warning(
                    "cannot create an NVML event set: %s (NVML error %d); %s",
                    exc,
                    exc.value,
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
                self._register(gpu)
        if old_set is not None:
            self._drain(old_set)
            self._free(old_set)

    def _register(self, gpu: Gpu) -> None:
        nv = self._nv
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(gpu.uuid)
            mask = int(nv.nvmlDeviceGetSupportedEventTypes(handle)) & self._wanted_events
            if mask:
                nv.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
        except pynvml.NVMLError as exc:
            if exc.value in LOST_ERRORS:
                self._fault(gpu, gpu.uuid, REASON_LOST, None, self._clock(), lost=True)
            elif exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
                self._report_polled(gpu, "it supports no health events")
            else:
                self._report_polled(gpu, f"registering for events failed: {exc} (NVML error {exc.value})")
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
                self._labels[gpu.uuid],
                why,
                self._poll_interval_s,
            )

    def _drain(self, event_set: Any) -> None:
        for _ in range(_DRAIN_LIMIT):
            try:
                data = self._nv.nvmlEventSetWait_v2(event_set, 0)
            except pynvml.NVMLError:
                return
            self._handle_event(data)

    def _free(self, event_set: Any) -> None:
        try:
            self._nv.nvmlEventSetFree(event_set)
        except pynvml.NVMLError as exc:
            log.warning("freeing an NVML event set failed: %s (NVML error %d)", exc, exc.value)

    def _first_time(self, kind: str, key: int | str) -> bool:
        if (kind, key) in self._logged_errors:
            return False
        self._logged_errors.add((kind, key))
        return True


def _labels(inventory: Inventory) -> dict[str, str]:
    """How log lines name each device: its index and UUID."""
    labels: dict[str, str] = {}
    for gpu in inventory.gpus:
        labels[gpu.uuid] = f"GPU {gpu.index} ({gpu.uuid})"
        for mig in gpu.mig_devices:
            labels[mig.uuid] = f"MIG device {gpu.index}:{mig.index} ({mig.uuid})"
    return labels


def _mig(gpu: Gpu, uuid: str) -> MigDevice | None:
    for mig in gpu.mig_devices:
        if mig.uuid == uuid:
            return mig
    return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value

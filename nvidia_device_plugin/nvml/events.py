"""NVML event sets and liveness probes, for the health monitor (which never imports pynvml itself).

Everything here is a thin, typed step over one or two NvmlApi calls: create / register / wait / drain /
free an event set, decode an event, probe whether a device is readable. NVML errors come out as
`NvmlFailure`, whose kind nvml/errors.py decides; its properties are the questions the monitor asks.

Stopping promptly: real nvmlEventSetWait cannot be interrupted, and freeing the set or shutting NVML
down under a waiting thread is unsafe, so a monitor on a real node waits out its timeout (500 ms) when it
stops. An API object may offer `interrupt_event_wait(event_set)` (the simulator does): `interrupt_wait`
uses it to make the current or next wait on that set return at once, as a timeout would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import pynvml

from nvidia_device_plugin.nvml.api import DeviceHandle, EventData, EventSetHandle, NvmlApi
from nvidia_device_plugin.nvml.bounded import EVENTS, BoundedNvml, on_lane
from nvidia_device_plugin.nvml.errors import NvmlErrorKind, classify, error_code

NOT_ATTRIBUTED = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of an event not tied to a MIG instance
# health.eventTypes names -> the NVML event bits that can change health. Single-bit ECC errors are
# corrected by the hardware, so that name is accepted (NVIDIA's default list has it) but never registered.
EVENT_TYPE_BITS = {
    "EventTypeXidCriticalError": int(pynvml.nvmlEventTypeXidCriticalError),
    "EventTypeDoubleBitEccError": int(pynvml.nvmlEventTypeDoubleBitEccError),
    "EventTypeSingleBitEccError": 0,
}
# A probe failing with these means the GPU is gone: fallen off the bus, or no longer listed by the driver.
# OTHER (UNKNOWN) is not among them: real drivers return it transiently; the monitor counts failures.
_LOST = frozenset({NvmlErrorKind.GPU_LOST, NvmlErrorKind.NOT_FOUND})


def event_mask(event_types: Iterable[str]) -> int:
    """The NVML event bits to register for these health.eventTypes names (unknown names add nothing)."""
    mask = 0
    for name in event_types:
        mask |= EVENT_TYPE_BITS.get(name, 0)
    return mask


class NvmlFailure(Exception):
    """An NVML call of the health monitor failed; `code` is NVML's return code."""

    def __init__(self, exc: pynvml.NVMLError) -> None:
        self.code = error_code(exc)
        self.kind = classify(exc)
        self.call: str = getattr(exc, "call", "")  # the stuck call, for STUCK (nvml/bounded.py)
        super().__init__(str(exc) if self.stuck else f"{exc} (NVML error {self.code})")

    @property
    def stuck(self) -> bool:
        """A call on the device did not return within its deadline (it may still be running)."""
        return self.kind is NvmlErrorKind.STUCK

    @property
    def shutting_down(self) -> bool:
        """Not waited for: the process is stopping (nvml/bounded.py's stop_waiting)."""
        return self.kind is NvmlErrorKind.SHUTTING_DOWN

    @property
    def means_lost(self) -> bool:
        """The device is gone (GPU_IS_LOST, or NOT_FOUND: the driver no longer lists it)."""
        return self.kind in _LOST

    @property
    def gpu_is_lost(self) -> bool:
        return self.kind is NvmlErrorKind.GPU_LOST

    @property
    def not_supported(self) -> bool:
        return self.kind is NvmlErrorKind.NOT_SUPPORTED

    @property
    def no_permission(self) -> bool:
        return self.kind is NvmlErrorKind.NO_PERMISSION


EventKind = Literal["xid", "double-bit-ecc", "other"]


@dataclass(frozen=True)
class HealthEvent:
    """One event read from an event set."""

    gpu_uuid: str | None  # None when NVML cannot say which GPU raised it (see uuid_failure)
    kind: EventKind
    xid: int | None = None  # for kind "xid"
    gpu_instance_id: int | None = None  # None: not tied to a MIG GPU instance
    compute_instance_id: int | None = None
    uuid_failure: NvmlFailure | None = field(default=None, compare=False)


ProbeState = Literal["ok", "lost", "stuck", "unknown"]


@dataclass(frozen=True)
class Probe:
    """Whether NVML reads a device now; `failure` says why when the state is "unknown" or "stuck"."""

    state: ProbeState
    failure: NvmlFailure | None = field(default=None, compare=False)


def create_event_set(nv: NvmlApi) -> EventSetHandle:
    try:
        return nv.nvmlEventSetCreate()
    except pynvml.NVMLError as exc:
        raise NvmlFailure(exc) from exc


def register_gpu(nv: NvmlApi, event_set: EventSetHandle, gpu_uuid: str, wanted: int) -> int:
    """Register `gpu_uuid` for the `wanted` events it supports; returns those bits (0: it supports none)."""

    def register() -> int:
        handle = nv.nvmlDeviceGetHandleByUUID(gpu_uuid)
        mask = int(nv.nvmlDeviceGetSupportedEventTypes(handle)) & wanted
        if mask:
            nv.nvmlDeviceRegisterEvents(handle, mask, event_set)
        return mask

    try:
        return on_lane(nv, gpu_uuid, f"registering {gpu_uuid} for events", register)
    except pynvml.NVMLError as exc:
        raise NvmlFailure(exc) from exc


def wait_events(nv: NvmlApi, event_set: EventSetHandle, timeout_ms: int, limit: int) -> list[HealthEvent]:
    """The next event and those queued behind it (at most `limit`), or none when `timeout_ms` passed (or
    the wait was interrupted) without one. One job on the event set's lane, so a storm costs one hand-over
    per batch, not per event."""

    def wait() -> list[HealthEvent]:
        try:
            data = nv.nvmlEventSetWait_v2(event_set, timeout_ms)
        except pynvml.NVMLError as exc:
            if classify(exc) is NvmlErrorKind.TIMEOUT:
                return []
            raise
        return [_decode(nv, data), *_queued(nv, event_set, limit - 1)]

    try:
        return on_lane(nv, EVENTS, "waiting for NVML events", wait, extra_s=timeout_ms / 1000.0)
    except pynvml.NVMLError as exc:
        raise NvmlFailure(exc) from exc


def drain_events(nv: NvmlApi, event_set: EventSetHandle, limit: int) -> list[HealthEvent]:
    """Events already queued on `event_set`, at most `limit`; ends at the first empty read or error
    (a stuck read among them)."""
    try:
        return on_lane(nv, EVENTS, "reading queued NVML events", lambda: list(_queued(nv, event_set, limit)))
    except pynvml.NVMLError:
        return []


def _queued(nv: NvmlApi, event_set: EventSetHandle, limit: int) -> Iterator[HealthEvent]:
    for _ in range(limit):
        try:
            data = nv.nvmlEventSetWait_v2(event_set, 0)
        except pynvml.NVMLError:
            return
        yield _decode(nv, data)


def free_event_set(nv: NvmlApi, event_set: EventSetHandle) -> None:
    try:
        nv.nvmlEventSetFree(event_set)
    except pynvml.NVMLError as exc:
        raise NvmlFailure(exc) from exc


def interrupt_wait(nv: NvmlApi, event_set: EventSetHandle) -> bool:
    """Make the current or next wait on `event_set` return now, where the API can; False where it cannot."""
    # Not isinstance(nv, InterruptibleWait): since Python 3.12 that looks attributes up statically, so it
    # misses the capability behind a wrapper's __getattr__ (BoundedNvml forwards it to the simulator).
    interrupt = getattr(nv, "interrupt_event_wait", None)
    if not callable(interrupt):
        return False
    interrupt(event_set)
    return True


def on_stuck_call_returned(nv: NvmlApi, listener: Callable[[], None]) -> Callable[[], None]:
    """Call `listener()` whenever a call that was stuck returns (its device can be read again), where `nv`
    is bounded (nvml/bounded.py); returns what ends that (a no-op elsewhere)."""
    if not isinstance(nv, BoundedNvml):
        return lambda: None

    def returned(call: str, stuck: bool) -> None:
        if not stuck:
            listener()

    return nv.subscribe(returned)


def probe(nv: NvmlApi, gpu_uuid: str, mig: tuple[int, str] | None = None) -> Probe:
    """Whether NVML reads the GPU now (handle by UUID, its UUID, its memory info), and the MIG device
    (index, UUID) on it when given. "stuck" when a call on it does not return in time (nvml/bounded.py)."""
    try:
        return on_lane(nv, gpu_uuid, f"checking {gpu_uuid}", lambda: _probe(nv, gpu_uuid, mig))
    except pynvml.NVMLError as exc:  # stuck: the job did not return; or not waited for, as the process stops
        failure = NvmlFailure(exc)
        return Probe("stuck" if failure.stuck else "unknown", failure)


def _probe(nv: NvmlApi, gpu_uuid: str, mig: tuple[int, str] | None) -> Probe:
    try:
        handle = nv.nvmlDeviceGetHandleByUUID(gpu_uuid)
        if nv.nvmlDeviceGetUUID(handle) != gpu_uuid:
            return Probe("lost")
        try:
            nv.nvmlDeviceGetMemoryInfo(handle)
        except pynvml.NVMLError as exc:
            if classify(exc) is not NvmlErrorKind.NOT_SUPPORTED:
                raise
        if mig is not None:
            mig_index, mig_uuid = mig
            if nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)) != mig_uuid:
                return Probe("lost")
    except pynvml.NVMLError as exc:
        failure = NvmlFailure(exc)
        if failure.stuck:
            return Probe("stuck", failure)
        return Probe("lost") if failure.means_lost else Probe("unknown", failure)
    return Probe("ok")


def probe_index(nv: NvmlApi, index: int) -> bool:
    """Whether NVML opens GPU `index` and reads its UUID now (a GPU discovery could not even open)."""

    def read() -> bool:
        return bool(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(index)))

    try:
        return on_lane(nv, index, f"checking GPU {index}", read)
    except pynvml.NVMLError:
        return False


def uncorrected_ecc(nv: NvmlApi, gpu_uuid: str) -> int | None:
    """The GPU's volatile uncorrected ECC error count; None where NVML cannot say (no ECC, no access, a
    call stuck)."""

    def read() -> int | None:
        return _uncorrected_ecc(nv, nv.nvmlDeviceGetHandleByUUID(gpu_uuid))

    try:
        return on_lane(nv, gpu_uuid, f"reading the ECC errors of {gpu_uuid}", read)
    except pynvml.NVMLError:
        return None


def _uncorrected_ecc(nv: NvmlApi, handle: DeviceHandle) -> int | None:
    try:
        return int(
            nv.nvmlDeviceGetTotalEccErrors(
                handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            )
        )
    except pynvml.NVMLError:
        return None


def recovery_blocker(nv: NvmlApi, gpu_uuid: str, ecc_baseline: int | None) -> str | None:
    """Why the GPU must stay out of service although NVML reads it (see _recovery_blocker); a check
    that does not return in time is one such reason."""
    try:
        return on_lane(
            nv,
            gpu_uuid,
            f"checking {gpu_uuid} can return",
            lambda: _recovery_blocker(nv, gpu_uuid, ecc_baseline),
        )
    except pynvml.NVMLError as exc:
        return f"checking it got stuck ({NvmlFailure(exc)})"


def _recovery_blocker(nv: NvmlApi, gpu_uuid: str, ecc_baseline: int | None) -> str | None:
    """Why the GPU must stay out of service although NVML reads it, or None when nothing NVML can tell
    speaks against it: new uncorrectable ECC errors since the fault, pending or failed row remapping,
    a GPU recovery action (reset, reboot, drain) the driver asks for. Checks the driver lacks are skipped.
    """
    try:
        handle = nv.nvmlDeviceGetHandleByUUID(gpu_uuid)
    except pynvml.NVMLError as exc:
        return f"NVML cannot open it ({NvmlFailure(exc)})"
    ecc = _uncorrected_ecc(nv, handle)
    if ecc is not None and ecc_baseline is not None and ecc > ecc_baseline:
        return f"{ecc - ecc_baseline} new uncorrectable ECC errors since the fault"
    try:
        _corr, _unc, pending, failure = nv.nvmlDeviceGetRemappedRows(handle)
        if failure:
            return "row remapping failed (the GPU needs service)"
        if pending:
            return "row remapping is pending (the GPU needs a reset)"
    except pynvml.NVMLError:
        pass  # pre-Ampere GPUs have no row remapping
    field = getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    if field is not None:
        try:
            value = nv.nvmlDeviceGetFieldValues(handle, [int(field)])[0]
            if int(value.nvmlReturn) == pynvml.NVML_SUCCESS and int(value.value.uiVal) != 0:
                return f"the driver asks for GPU recovery action {int(value.value.uiVal)}"
        except pynvml.NVMLError:
            pass  # drivers before R550 lack the field
    return None


def _decode(nv: NvmlApi, data: EventData) -> HealthEvent:
    event_type = int(data.eventType)
    gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
    try:
        uuid: str | None = nv.nvmlDeviceGetUUID(data.device)
        failure = None
    except pynvml.NVMLError as exc:
        uuid, failure = None, NvmlFailure(exc)
    # Double-bit ECC first: an event with both bits is the wider failure.
    if event_type & EVENT_TYPE_BITS["EventTypeDoubleBitEccError"]:
        return HealthEvent(uuid, "double-bit-ecc", uuid_failure=failure)
    if event_type & EVENT_TYPE_BITS["EventTypeXidCriticalError"]:
        return HealthEvent(
            uuid,
            "xid",
            xid=int(data.eventData),
            gpu_instance_id=None if gi == NOT_ATTRIBUTED else gi,
            compute_instance_id=None if ci == NOT_ATTRIBUTED else ci,
            uuid_failure=failure,
        )
    return HealthEvent(uuid, "other", uuid_failure=failure)

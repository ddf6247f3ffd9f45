"""A stand-in for the `pynvml` module, driven by a NodeSpec.

It implements exactly the pynvml functions of `NvmlApi` (nvml/api.py), with pynvml's names, arguments,
return types (the same ctypes structs and handle pointer types) and `pynvml.NVMLError` codes, so
discovery and health code cannot tell it from a real node. Constants, structs and exception classes are
looked up on the real pynvml module; an `nvml*` function it does not implement is an AttributeError
naming it, never a silent fall-through to the real library. Methods outside pynvml's API (inject_xid,
set_lost, fail_next, interrupt_event_wait, materialize_host) are the simulation's controls.
"""

from __future__ import annotations

import ctypes
import functools
import types
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from nvidia_device_plugin.nvml.api import (
    DeviceAttributes,
    DeviceHandle,
    EventData,
    EventSetHandle,
    FieldValue,
    GpuInstanceHandle,
    GpuInstanceInfo,
    GpuInstanceProfileInfo,
    MemoryInfo,
    PciInfo,
)
from nvidia_device_plugin.nvml.mig_profiles import profile_id_for
from nvidia_device_plugin.nvml.sim.host import gpu_minor, mig_instance_ids
from nvidia_device_plugin.nvml.sim.node import GpuSpec, MigSpec
from nvidia_device_plugin.nvml.sim.state import (
    _GPU_INSTANCE_BASE,
    _GPU_STRIDE,
    _MIG_STRIDE,
    SimulatorState,
    _address,
    _EventSet,
    _nvml_error,
)

F = TypeVar("F", bound=Callable[..., Any])


def _api(fn: F) -> F:
    """Marks a pynvml function: applies injected failures and checks init under the lock, then calls
    it outside the lock."""

    @functools.wraps(fn)
    def wrapper(self: SimulatedNvml, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self._maybe_fail(fn.__name__, args[0] if args else None)
            if fn.__name__ != "nvmlInit" and self._init_count == 0:
                raise _nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        return fn(self, *args, **kwargs)

    wrapper.__dict__["pynvml_api"] = True
    return wrapper  # type: ignore[return-value]


class SimulatedNvml(SimulatorState):
    """pynvml, as seen on the simulated node."""

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not defined on the class. A missing function must fail here, loudly:
        # forwarding it to the real pynvml would surface as NVMLError_Uninitialized far from the cause.
        if name.startswith("nvml") and isinstance(getattr(pynvml, name, None), types.FunctionType):
            raise AttributeError(
                f"the pynvml simulator does not implement {name}; add it to nvml/sim/simulator.py "
                "(and to NvmlApi in nvml/api.py)"
            )
        # Constants, structs and exception classes are pynvml's own.
        return getattr(pynvml, name)

    # ---- pynvml: library ----------------------------------------------------------------------

    @_api
    def nvmlInit(self) -> None:
        with self._lock:
            self._init_count += 1

    @_api
    def nvmlShutdown(self) -> None:
        with self._lock:
            self._init_count -= 1

    @_api
    def nvmlSystemGetDriverVersion(self) -> str:
        return self.node.driver_version

    @_api
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.node.cuda_driver_version

    # ---- pynvml: device handles ---------------------------------------------------------------

    @_api
    def nvmlDeviceGetCount(self) -> int:
        return len(self.node.gpus)

    @_api
    def nvmlDeviceGetHandleByIndex(self, index: int) -> DeviceHandle:
        if not 0 <= index < len(self.node.gpus):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._check_not_lost(index)
        return self._handle(_GPU_STRIDE * (index + 1))

    @_api
    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> DeviceHandle:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.node.gpus:
            if gpu.uuid == text:
                self._check_not_lost(gpu.index)
                return self._handle(_GPU_STRIDE * (gpu.index + 1))
            for mig in gpu.mig:
                if mig.uuid == text:
                    self._check_not_lost(gpu.index)
                    return self._handle(_GPU_STRIDE * (gpu.index + 1) + _MIG_STRIDE * (mig.slot + 1))
        raise _nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    @_api
    def nvmlDeviceGetUUID(self, handle: DeviceHandle) -> str:
        gpu, mig = self._device(handle)
        return mig.uuid if mig else gpu.uuid

    @_api
    def nvmlDeviceGetName(self, handle: DeviceHandle) -> str:
        gpu, mig = self._device(handle)
        return f"{gpu.name} MIG {mig.profile}" if mig else gpu.name

    @_api
    def nvmlDeviceGetMinorNumber(self, handle: DeviceHandle) -> int:
        gpu, mig = self._device(handle)
        if mig:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu_minor(gpu)

    @_api
    def nvmlDeviceGetMemoryInfo(self, handle: DeviceHandle, version: int | None = None) -> MemoryInfo:
        gpu, mig = self._device(handle)
        memory: MemoryInfo = pynvml.c_nvmlMemory_t()
        memory.total = (self._mig_memory_mb(gpu, mig) if mig else gpu.memory_mib) * 1024 * 1024
        memory.used = 0
        memory.free = memory.total
        return memory

    @_api
    def nvmlDeviceGetPciInfo(self, handle: DeviceHandle) -> PciInfo:
        gpu, _ = self._device(handle)
        return self._pci_info(gpu.pci_bus_id)

    @_api
    def nvmlDeviceGetNumaNodeId(self, handle: DeviceHandle) -> int:
        gpu, _ = self._device(handle)
        if gpu.numa_node < 0:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.numa_node

    @_api
    def nvmlDeviceGetCudaComputeCapability(self, handle: DeviceHandle) -> tuple[int, int]:
        gpu, _ = self._device(handle)  # a MIG device answers for its GPU
        if gpu.compute_capability is None:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.compute_capability

    # ---- pynvml: health beyond events ---------------------------------------------------------

    @_api
    def nvmlDeviceGetTotalEccErrors(self, handle: DeviceHandle, errorType: int, counterType: int) -> int:
        gpu, _ = self._device(handle)
        if errorType != pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return 0
        with self._lock:
            return self._ecc_uncorrected.get(gpu.index, 0)

    @_api
    def nvmlDeviceGetRemappedRows(self, device: DeviceHandle) -> tuple[int, int, int, int]:
        gpu, _ = self._device(device)
        with self._lock:
            pending, failure = self._remapped.get(gpu.index, (0, 0))
        return 0, 0, pending, failure

    @_api
    def nvmlDeviceGetFieldValues(self, handle: DeviceHandle, fieldIds: list[int]) -> list[FieldValue]:
        gpu, _ = self._device(handle)
        values: Any = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for i, field_id in enumerate(fieldIds):
            values[i].fieldId = field_id
            if field_id == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                with self._lock:
                    values[i].value.uiVal = self._recovery_action.get(gpu.index, 0)
                values[i].nvmlReturn = pynvml.NVML_SUCCESS
            else:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return list(values)

    # ---- pynvml: MIG --------------------------------------------------------------------------

    @_api
    def nvmlDeviceGetMigMode(self, device: DeviceHandle) -> list[int]:
        gpu, mig = self._device(device)
        if mig or not gpu.mig_capable:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    @_api
    def nvmlDeviceGetMaxMigDeviceCount(self, device: DeviceHandle) -> int:
        gpu, mig = self._device(device)
        if mig:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 7 if gpu.mig_enabled else 0  # real drivers answer 0, not an error, outside MIG mode

    @_api
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: DeviceHandle, index: int) -> DeviceHandle:
        gpu, mig = self._device(device)
        if mig or not gpu.mig_enabled:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.node.unprivileged_container:
            raise _nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        if not any(m.slot == index for m in gpu.mig):
            # An empty slot: drivers answer NOT_FOUND or INVALID_ARGUMENT; simulate the latter past the
            # last device and NOT_FOUND for gaps, so discovery is shown to take both.
            last = max((m.slot for m in gpu.mig), default=-1)
            code = pynvml.NVML_ERROR_INVALID_ARGUMENT if index > last else pynvml.NVML_ERROR_NOT_FOUND
            raise _nvml_error(code)
        return self._handle(_GPU_STRIDE * (gpu.index + 1) + _MIG_STRIDE * (index + 1))

    @_api
    def nvmlDeviceGetGpuInstanceById(self, device: DeviceHandle, gpuInstanceId: int) -> GpuInstanceHandle:
        gpu, mig = self._device(device)
        if mig or not gpu.mig_enabled:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.node.unprivileged_container:
            raise _nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        if not any(mig_instance_ids(gpu, m)[0] == gpuInstanceId for m in gpu.mig):
            raise _nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        address = _GPU_INSTANCE_BASE + gpu.index * 0x100 + gpuInstanceId
        return GpuInstanceHandle(ctypes.cast(address, pynvml.c_nvmlGpuInstance_t))

    @_api
    def nvmlGpuInstanceGetInfo(self, gpuInstance: GpuInstanceHandle) -> GpuInstanceInfo:
        offset = _address(gpuInstance) - _GPU_INSTANCE_BASE
        gpu_index, gi = divmod(offset, 0x100)
        if not 0 <= gpu_index < len(self.node.gpus):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.node.gpus[gpu_index]
        with self._lock:
            self._check_not_lost(gpu_index)
        mig = next((m for m in gpu.mig if mig_instance_ids(gpu, m)[0] == gi), None)
        if mig is None:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        info: Any = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id = gi
        info.profileId = self._profile_info_id(mig)
        result: GpuInstanceInfo = info
        return result

    @_api
    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: DeviceHandle, profile: int, version: int = 2
    ) -> GpuInstanceProfileInfo:
        gpu, mig = self._device(device)
        if mig or not gpu.mig_capable:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        used = next((m for m in gpu.mig if profile_id_for(m.gpu_slices, m.suffix) == profile), None)
        if used is None:  # the simulator only describes the profiles the node file uses
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info: Any = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id = self._profile_info_id(used)
        info.sliceCount = used.gpu_slices
        info.memorySizeMB = self._mig_memory_mb(gpu, used)
        result: GpuInstanceProfileInfo = info
        return result

    @_api
    def nvmlDeviceGetGpuInstanceId(self, device: DeviceHandle) -> int:
        gpu, mig = self._device(device)
        if not mig:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig_instance_ids(gpu, mig)[0]

    @_api
    def nvmlDeviceGetComputeInstanceId(self, device: DeviceHandle) -> int:
        gpu, mig = self._device(device)
        if not mig:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig_instance_ids(gpu, mig)[1]

    @_api
    def nvmlDeviceGetAttributes(self, device: DeviceHandle) -> DeviceAttributes:
        gpu, mig = self._device(device)
        attrs: DeviceAttributes = pynvml.c_nvmlDeviceAttributes()
        if mig:
            attrs.gpuInstanceSliceCount = mig.gpu_slices
            attrs.computeInstanceSliceCount = mig.compute_slices
            attrs.multiprocessorCount = _sms_per_slice(gpu) * mig.compute_slices
            attrs.memorySizeMB = self._mig_memory_mb(gpu, mig)
            engines = _mig_engines(mig)
            attrs.sharedCopyEngineCount = engines[0]
            attrs.sharedDecoderCount = engines[1]
            attrs.sharedEncoderCount = engines[2]
            attrs.sharedJpegCount = engines[3]
            attrs.sharedOfaCount = engines[4]
        else:
            attrs.gpuInstanceSliceCount = 7
            attrs.computeInstanceSliceCount = 7
            attrs.multiprocessorCount = 108
            attrs.memorySizeMB = gpu.memory_mib
        return attrs

    # ---- pynvml: topology ---------------------------------------------------------------------

    @_api
    def nvmlDeviceGetNvLinkState(self, device: DeviceHandle, link: int) -> int:
        gpu, mig = self._device(device)
        if mig:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        targets = self._link_targets(gpu)
        if not targets:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(pynvml.NVML_FEATURE_ENABLED if link < len(targets) else pynvml.NVML_FEATURE_DISABLED)

    @_api
    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: DeviceHandle, link: int) -> PciInfo:
        gpu, _ = self._device(device)
        targets = self._link_targets(gpu)
        if not 0 <= link < len(targets):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._pci_info(targets[link][1])

    @_api
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: DeviceHandle, link: int) -> int:
        gpu, _ = self._device(handle)
        targets = self._link_targets(gpu)
        if not 0 <= link < len(targets):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return targets[link][0]

    @_api
    def nvmlDeviceGetTopologyCommonAncestor(self, device1: DeviceHandle, device2: DeviceHandle) -> int:
        a, _ = self._device(device1)
        b, _ = self._device(device2)
        if a.index == b.index:
            return int(pynvml.NVML_TOPOLOGY_INTERNAL)
        if a.pcie_switch is not None and a.pcie_switch == b.pcie_switch:
            return int(pynvml.NVML_TOPOLOGY_SINGLE)
        if a.numa_node == b.numa_node:
            return int(pynvml.NVML_TOPOLOGY_NODE)
        return int(pynvml.NVML_TOPOLOGY_SYSTEM)

    # ---- pynvml: events -----------------------------------------------------------------------

    @_api
    def nvmlDeviceGetSupportedEventTypes(self, handle: DeviceHandle) -> int:
        gpu, _ = self._device(handle)
        if not gpu.events:
            return 0
        return int(pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError)

    @_api
    def nvmlEventSetCreate(self) -> EventSetHandle:
        with self._lock:
            self._next_event_set += 0x10
            address = self._next_event_set
            self._event_sets[address] = _EventSet(address)
        return EventSetHandle(ctypes.cast(address, pynvml.c_nvmlEventSet_t))

    @_api
    def nvmlEventSetFree(self, eventSet: EventSetHandle) -> None:
        with self._lock:
            self._event_sets.pop(_address(eventSet), None)

    @_api
    def nvmlDeviceRegisterEvents(
        self, handle: DeviceHandle, eventTypes: int, eventSet: EventSetHandle
    ) -> None:
        gpu, mig = self._device(handle)
        if not gpu.events or mig:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if self.node.unprivileged_container and gpu.mig_enabled:
            # XIDs attributed to MIG instances need CAP_SYS_ADMIN.
            raise _nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        with self._lock:
            event_set = self._event_set(eventSet)
            event_set.masks[gpu.index] = event_set.masks.get(gpu.index, 0) | eventTypes

    @_api
    def nvmlEventSetWait_v2(self, eventSet: EventSetHandle, timeoutms: int) -> EventData:
        with self._events_ready:
            event_set = self._event_set(eventSet)
            if not event_set.queue:
                # Wakes early for an event, a freed set, or interrupt_event_wait (which real NVML lacks).
                self._events_ready.wait_for(
                    lambda: (
                        bool(event_set.queue) or event_set.woken or event_set.address not in self._event_sets
                    ),
                    timeout=timeoutms / 1000.0,
                )
            if not event_set.queue:
                event_set.woken = False
                if self.lost_fails_event_wait and any(i in self._lost for i in event_set.masks):
                    raise _nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
                raise _nvml_error(pynvml.NVML_ERROR_TIMEOUT)
            gpu_index, event_type, data, gi, ci = event_set.queue.popleft()
        event: EventData = pynvml.c_nvmlEventData_t()
        event.device = self._handle(_GPU_STRIDE * (gpu_index + 1))
        event.eventType = event_type
        event.eventData = data
        event.gpuInstanceId = gi
        event.computeInstanceId = ci
        return event

    # ---- pynvml: compute mode (mps-control-daemon) ------------------------------------------------
    # Kept at the end of the class so that parallel edits above merge cleanly. Every GPU starts in
    # DEFAULT; MIG devices have no compute mode of their own (NOT_SUPPORTED, as on a real A100/H100).

    def _compute_modes(self) -> dict[int, int]:
        modes: dict[int, int] = vars(self).setdefault("_compute_mode_by_gpu", {})
        return modes

    @_api
    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        gpu, mig = self._device(handle)
        if mig:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            mode: int = self._compute_modes().get(gpu.index, pynvml.NVML_COMPUTEMODE_DEFAULT)
        return mode

    @_api
    def nvmlDeviceSetComputeMode(self, handle: Any, mode: int) -> None:
        gpu, mig = self._device(handle)
        if mig:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if mode not in (
            pynvml.NVML_COMPUTEMODE_DEFAULT,
            pynvml.NVML_COMPUTEMODE_PROHIBITED,
            pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
        ):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            self._compute_modes()[gpu.index] = mode


def _sms_per_slice(gpu: GpuSpec) -> int:
    """SMs of one compute slice: 14 on Ampere (A100: 98 SMs in 7 slices), 16 on Hopper and later."""
    major = gpu.compute_capability[0] if gpu.compute_capability else 8
    return 14 if major < 9 else 16


# Shared engines of a MIG device by GPU-instance slices (copy, NVDEC, NVENC, NVJPG, OFA), as nvidia-smi
# mig -lgip lists them for A100/H100 class GPUs; "+me" profiles take the media engines of the whole GPU.
_MIG_ENGINES = {
    1: (1, 0, 0, 0, 0),
    2: (2, 1, 0, 0, 0),
    3: (3, 2, 0, 0, 0),
    4: (4, 2, 0, 0, 0),
    7: (7, 5, 0, 1, 1),
}


def _mig_engines(mig: MigSpec) -> tuple[int, int, int, int, int]:
    copy, decoders, encoders, jpeg, ofa = _MIG_ENGINES.get(mig.gpu_slices, (mig.gpu_slices, 0, 0, 0, 0))
    if mig.suffix.startswith("+me"):
        return copy, max(decoders, 1), encoders, max(jpeg, 1), max(ofa, 1)
    if mig.suffix == "-me":
        return copy, 0, 0, 0, 0
    return copy, decoders, encoders, jpeg, ofa


def simulated_functions() -> list[str]:
    """Names of the pynvml functions this simulator implements."""
    return sorted(n for n, v in vars(SimulatedNvml).items() if getattr(v, "pynvml_api", False))

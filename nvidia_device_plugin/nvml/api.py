"""The pynvml API as this plugin uses it: every function product code calls, typed.

`NvmlApi` is satisfied by the real `pynvml` module (untyped, so mypy takes it as is;
tests/nvml/test_simulator.py checks each member against pynvml's signatures at run time) and by
`SimulatedNvml` (checked by mypy where the session is built). A product call of an nvml function not
declared here fails a test: declare it here first, then implement it in the simulator.

pynvml hands back ctypes pointers for handles and ctypes structures for results. Handles are opaque to
us, so they are NewTypes over `object` (code can pass them on, nothing else); structures are Protocols
naming only the fields we read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NewType, Protocol

DeviceHandle = NewType("DeviceHandle", object)  # pynvml.c_nvmlDevice_t: a GPU or a MIG device
EventSetHandle = NewType("EventSetHandle", object)  # pynvml.c_nvmlEventSet_t
GpuInstanceHandle = NewType("GpuInstanceHandle", object)  # pynvml.c_nvmlGpuInstance_t
ComputeInstanceHandle = NewType("ComputeInstanceHandle", object)  # pynvml.c_nvmlComputeInstance_t


class MemoryInfo(Protocol):
    """pynvml.c_nvmlMemory_t: bytes of device memory."""

    total: int
    free: int
    used: int


class PciInfo(Protocol):
    """pynvml.nvmlPciInfo_t; busId is NVML's form, "00000000:07:00.0" (bytes from ctypes)."""

    busId: bytes | str


class DeviceAttributes(Protocol):
    """pynvml.c_nvmlDeviceAttributes, as read for a MIG device."""

    gpuInstanceSliceCount: int
    computeInstanceSliceCount: int
    multiprocessorCount: int
    memorySizeMB: int
    sharedCopyEngineCount: int
    sharedDecoderCount: int
    sharedEncoderCount: int
    sharedJpegCount: int
    sharedOfaCount: int


class GpuInstancePlacement(Protocol):
    """pynvml.c_nvmlGpuInstancePlacement_t: the first memory slice of a GPU instance and how many it spans."""

    start: int
    size: int


class GpuInstanceInfo(Protocol):
    """pynvml.c_nvmlGpuInstanceInfo_t: a GPU instance; profileId is the profile's `id`."""

    id: int
    profileId: int
    placement: GpuInstancePlacement


class GpuInstanceProfileInfo(Protocol):
    """pynvml.c_nvmlGpuInstanceProfileInfo_v2_t (or v1): what one GPU-instance profile is on this GPU."""

    id: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int
    copyEngineCount: int
    decoderCount: int
    encoderCount: int
    jpegCount: int
    ofaCount: int
    memorySizeMB: int


class ComputeInstanceProfileInfo(Protocol):
    """pynvml.c_nvmlComputeInstanceProfileInfo_v2_t: one compute-instance profile of a GPU instance."""

    id: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int


class ComputeInstanceInfo(Protocol):
    """pynvml.c_nvmlComputeInstanceInfo_t: a compute instance; `id` is its compute instance ID."""

    id: int
    profileId: int


class FieldValue(Protocol):
    """One pynvml.c_nvmlFieldValue_t of nvmlDeviceGetFieldValues; `nvmlReturn` is that field's status."""

    fieldId: int
    nvmlReturn: int
    value: FieldValueUnion


class FieldValueUnion(Protocol):
    """pynvml.c_nvmlValue_t, the members we read."""

    uiVal: int


class EventData(Protocol):
    """pynvml.c_nvmlEventData_t: one event read from an event set."""

    device: DeviceHandle
    eventType: int
    eventData: int  # the XID, for XID events
    gpuInstanceId: int  # 0xFFFFFFFF when not tied to a MIG instance
    computeInstanceId: int


class GpuFabricInfo(Protocol):
    """pynvml.c_nvmlGpuFabricInfo_t, which nvmlDeviceGetGpuFabricInfo fills through a pointer to it.

    `clusterUuid` is a ctypes array of 16 bytes; `status` an NVML return code (the fabric manager's verdict
    on this GPU); `state` one of NVML_GPU_FABRIC_STATE_* (COMPLETED once registration is done).
    """

    clusterUuid: Sequence[int]
    status: int
    cliqueId: int
    state: int


class NvmlApi(Protocol):
    """The pynvml functions the plugin calls, with pynvml's names, parameters and results.

    Every function raises pynvml.NVMLError (a subclass per code) on failure.
    """

    # ---- library
    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...

    # ---- devices
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> DeviceHandle: ...
    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> DeviceHandle: ...
    def nvmlDeviceGetUUID(self, handle: DeviceHandle) -> str: ...
    def nvmlDeviceGetName(self, handle: DeviceHandle) -> str: ...
    def nvmlDeviceGetMinorNumber(self, handle: DeviceHandle) -> int: ...
    def nvmlDeviceGetMemoryInfo(self, handle: DeviceHandle, version: int | None = None) -> MemoryInfo: ...
    def nvmlDeviceGetPciInfo(self, handle: DeviceHandle) -> PciInfo: ...
    def nvmlDeviceGetNumaNodeId(self, handle: DeviceHandle) -> int: ...
    def nvmlDeviceGetCudaComputeCapability(self, handle: DeviceHandle) -> tuple[int, int]: ...
    # `gpuFabricInfo` is ctypes.byref(pynvml.c_nvmlGpuFabricInfo_t()): NVML fills the struct; returns SUCCESS.
    def nvmlDeviceGetGpuFabricInfo(self, device: DeviceHandle, gpuFabricInfo: object) -> int: ...
    def nvmlDeviceGetBrand(self, handle: DeviceHandle) -> int: ...  # NVML_BRAND_*
    def nvmlDeviceGetArchitecture(self, device: DeviceHandle) -> int: ...  # NVML_DEVICE_ARCH_*

    # ---- health beyond events (recovery checks)
    def nvmlDeviceGetTotalEccErrors(self, handle: DeviceHandle, errorType: int, counterType: int) -> int: ...
    def nvmlDeviceGetRemappedRows(self, device: DeviceHandle) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetFieldValues(self, handle: DeviceHandle, fieldIds: list[int]) -> list[FieldValue]: ...

    # ---- MIG
    def nvmlDeviceGetMigMode(self, device: DeviceHandle) -> list[int]: ...  # [current, pending]
    def nvmlDeviceGetComputeMode(self, handle: DeviceHandle) -> int: ...
    def nvmlDeviceSetComputeMode(self, handle: DeviceHandle, mode: int) -> None: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, device: DeviceHandle) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: DeviceHandle, index: int) -> DeviceHandle: ...
    def nvmlDeviceGetAttributes(self, device: DeviceHandle) -> DeviceAttributes: ...
    def nvmlDeviceGetGpuInstanceId(self, device: DeviceHandle) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, device: DeviceHandle) -> int: ...
    def nvmlDeviceGetGpuInstanceById(self, device: DeviceHandle, gpuInstanceId: int) -> GpuInstanceHandle: ...
    def nvmlGpuInstanceGetInfo(self, gpuInstance: GpuInstanceHandle) -> GpuInstanceInfo: ...
    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: DeviceHandle, profile: int, version: int = 2
    ) -> GpuInstanceProfileInfo: ...

    # ---- MIG management (nvml/mig_manager.py). `profileId` is a profile info's `id`. The *Ref arguments
    # are what the C API writes through: a ctypes array (None: only count) and ctypes.byref(c_uint()).
    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: DeviceHandle, profileId: int) -> int: ...
    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: DeviceHandle, profileId: int, placementsRef: object, countRef: object
    ) -> int: ...
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: DeviceHandle, profileId: int, placement: object
    ) -> GpuInstanceHandle: ...
    def nvmlGpuInstanceDestroy(self, gpuInstance: GpuInstanceHandle) -> int: ...
    def nvmlDeviceGetGpuInstances(
        self, device: DeviceHandle, profileId: int, gpuInstancesRef: object, countRef: object
    ) -> int: ...
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: GpuInstanceHandle, profile: int, engProfile: int, version: int = 2
    ) -> ComputeInstanceProfileInfo: ...
    def nvmlGpuInstanceCreateComputeInstance(
        self, gpuInstance: GpuInstanceHandle, profileId: int
    ) -> ComputeInstanceHandle: ...
    def nvmlComputeInstanceDestroy(self, computeInstance: ComputeInstanceHandle) -> int: ...
    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: GpuInstanceHandle, profileId: int, computeInstancesRef: object, countRef: object
    ) -> int: ...
    def nvmlComputeInstanceGetInfo(self, computeInstance: ComputeInstanceHandle) -> ComputeInstanceInfo: ...

    # ---- topology
    def nvmlDeviceGetNvLinkState(self, device: DeviceHandle, link: int) -> int: ...
    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: DeviceHandle, link: int) -> PciInfo: ...
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: DeviceHandle, link: int) -> int: ...
    def nvmlDeviceGetTopologyCommonAncestor(self, device1: DeviceHandle, device2: DeviceHandle) -> int: ...

    # ---- events
    def nvmlDeviceGetSupportedEventTypes(self, handle: DeviceHandle) -> int: ...
    def nvmlEventSetCreate(self) -> EventSetHandle: ...
    def nvmlDeviceRegisterEvents(
        self, handle: DeviceHandle, eventTypes: int, eventSet: EventSetHandle
    ) -> None: ...
    def nvmlEventSetWait_v2(self, eventSet: EventSetHandle, timeoutms: int) -> EventData: ...
    def nvmlEventSetFree(self, eventSet: EventSetHandle) -> None: ...


def api_functions() -> list[str]:
    """Names of the pynvml functions NvmlApi declares."""
    return sorted(name for name in vars(NvmlApi) if name.startswith("nvml"))

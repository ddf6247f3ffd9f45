"""The simulated pynvml calls of one device: handles, identity, memory, PCI, NVLink fabric, health counters,
compute mode."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from nvidia_device_plugin.nvml.api import DeviceHandle, FieldValue, MemoryInfo, PciInfo
from nvidia_device_plugin.nvml.sim.host import gpu_minor
from nvidia_device_plugin.nvml.sim.state import (
    _GPU_STRIDE,
    _MIG_STRIDE,
    SimulatorState,
    _nvml_error,
    pynvml_function,
)


def _fabric_struct(pointer: object) -> Any:
    """The c_nvmlGpuFabricInfo_t that `pointer` (ctypes.byref or ctypes.pointer) points to.

    NVML writes through the pointer; anything else (the struct itself, None) is INVALID_ARGUMENT here, where
    the real library would be handed garbage.
    """
    target = getattr(pointer, "_obj", None)  # ctypes.byref(struct)
    if target is None and isinstance(pointer, ctypes._Pointer):
        target = pointer.contents
    if not isinstance(target, pynvml.c_nvmlGpuFabricInfo_t):
        raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return target


class DeviceQueries(SimulatorState):
    """pynvml's per-device calls on the simulated node."""

    # ---- handles and identity ---------------------------------------------------------------------

    @pynvml_function
    def nvmlDeviceGetCount(self) -> int:
        return len(self.node.gpus)

    @pynvml_function
    def nvmlDeviceGetHandleByIndex(self, index: int) -> DeviceHandle:
        if not 0 <= index < len(self.node.gpus):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._check_not_lost(index)
        return self._handle(_GPU_STRIDE * (index + 1))

    @pynvml_function
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

    @pynvml_function
    def nvmlDeviceGetUUID(self, handle: DeviceHandle) -> str:
        gpu, mig = self._device(handle)
        return mig.uuid if mig else gpu.uuid

    @pynvml_function
    def nvmlDeviceGetName(self, handle: DeviceHandle) -> str:
        gpu, mig = self._device(handle)
        return f"{gpu.name} MIG {mig.profile}" if mig else gpu.name

    @pynvml_function
    def nvmlDeviceGetMinorNumber(self, handle: DeviceHandle) -> int:
        gpu, mig = self._device(handle)
        if mig:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu_minor(gpu)

    @pynvml_function
    def nvmlDeviceGetMemoryInfo(self, handle: DeviceHandle, version: int | None = None) -> MemoryInfo:
        gpu, mig = self._device(handle)
        memory: MemoryInfo = pynvml.c_nvmlMemory_t()
        memory.total = (self._mig_memory_mb(gpu, mig) if mig else gpu.memory_mib) * 1024 * 1024
        memory.used = 0
        memory.free = memory.total
        return memory

    @pynvml_function
    def nvmlDeviceGetPciInfo(self, handle: DeviceHandle) -> PciInfo:
        gpu, _ = self._device(handle)
        return self._pci_info(gpu.pci_bus_id)

    @pynvml_function
    def nvmlDeviceGetNumaNodeId(self, handle: DeviceHandle) -> int:
        gpu, _ = self._device(handle)
        if gpu.numa_node < 0:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.numa_node

    @pynvml_function
    def nvmlDeviceGetCudaComputeCapability(self, handle: DeviceHandle) -> tuple[int, int]:
        gpu, _ = self._device(handle)  # a MIG device answers for its GPU
        if gpu.compute_capability is None:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.compute_capability

    @pynvml_function
    def nvmlDeviceGetGpuFabricInfo(self, device: DeviceHandle, gpuFabricInfo: object) -> int:
        gpu, mig = self._device(device)
        info = _fabric_struct(gpuFabricInfo)
        if mig or gpu.fabric is None:  # no fabric, or a MIG device (the fabric is its GPU's)
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info.clusterUuid[:] = gpu.fabric.cluster_uuid
        info.status = gpu.fabric.status
        info.cliqueId = gpu.fabric.clique_id
        info.state = gpu.fabric.state
        return int(pynvml.NVML_SUCCESS)

    # ---- health beyond events ---------------------------------------------------------------------

    @pynvml_function
    def nvmlDeviceGetTotalEccErrors(self, handle: DeviceHandle, errorType: int, counterType: int) -> int:
        gpu, _ = self._device(handle)
        if errorType != pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return 0
        with self._lock:
            return self._ecc_uncorrected.get(gpu.index, 0)

    @pynvml_function
    def nvmlDeviceGetRemappedRows(self, device: DeviceHandle) -> tuple[int, int, int, int]:
        gpu, _ = self._device(device)
        with self._lock:
            pending, failure = self._remapped.get(gpu.index, (0, 0))
        return 0, 0, pending, failure

    @pynvml_function
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

    # ---- compute mode (mps-control-daemon) --------------------------------------------------------
    # MIG devices have no compute mode of their own (NOT_SUPPORTED, as on a real A100/H100).

    @pynvml_function
    def nvmlDeviceGetComputeMode(self, handle: DeviceHandle) -> int:
        gpu, mig = self._device(handle)
        if mig:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            mode: int = self._compute_modes.get(gpu.index, pynvml.NVML_COMPUTEMODE_DEFAULT)
        return mode

    @pynvml_function
    def nvmlDeviceSetComputeMode(self, handle: DeviceHandle, mode: int) -> None:
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
            self._compute_modes[gpu.index] = mode

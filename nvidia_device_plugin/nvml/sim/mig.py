"""The simulated pynvml functions of MIG: mode, device handles by slot, GPU instances and profiles."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from nvidia_device_plugin.nvml.api import (
    DeviceAttributes,
    DeviceHandle,
    GpuInstanceHandle,
    GpuInstanceInfo,
    GpuInstanceProfileInfo,
)
from nvidia_device_plugin.nvml.mig_profiles import profile_id_for
from nvidia_device_plugin.nvml.sim.gi_profiles import GiProfile, profile_by_index, profile_template
from nvidia_device_plugin.nvml.sim.host import mig_instance_ids
from nvidia_device_plugin.nvml.sim.node import GpuSpec, MigSpec
from nvidia_device_plugin.nvml.sim.placement import fit_placements, gpu_slices, memory_slices
from nvidia_device_plugin.nvml.sim.state import (
    _GPU_STRIDE,
    _MIG_STRIDE,
    SimulatorState,
    _nvml_error,
    pynvml_function,
)


class MigQueries(SimulatorState):
    """pynvml's MIG calls on the simulated node."""

    @pynvml_function
    def nvmlDeviceGetMigMode(self, device: DeviceHandle) -> list[int]:
        gpu, mig = self._device(device)
        if mig or not gpu.mig_capable:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    @pynvml_function
    def nvmlDeviceGetMaxMigDeviceCount(self, device: DeviceHandle) -> int:
        gpu, mig = self._device(device)
        if mig:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 7 if gpu.mig_enabled else 0  # real drivers answer 0, not an error, outside MIG mode

    @pynvml_function
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

    @pynvml_function
    def nvmlDeviceGetGpuInstanceById(self, device: DeviceHandle, gpuInstanceId: int) -> GpuInstanceHandle:
        gpu, mig = self._device(device)
        if mig or not gpu.mig_enabled:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.node.unprivileged_container:
            raise _nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        if self._instance_of(gpu, gpuInstanceId) == (None, None):
            raise _nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        address = self._gi_handle_address(gpu, gpuInstanceId)
        return GpuInstanceHandle(ctypes.cast(address, pynvml.c_nvmlGpuInstance_t))

    @pynvml_function
    def nvmlGpuInstanceGetInfo(self, gpuInstance: GpuInstanceHandle) -> GpuInstanceInfo:
        gpu, gi = self._gpu_instance(gpuInstance)
        mig, bare = self._instance_of(gpu, gi)
        info: Any = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id = gi
        if mig is not None:
            info.profileId = self._profile_info_id(gpu, mig)
            info.placement.start, info.placement.size = instance_placement(gpu, mig)
        elif bare is not None:
            info.profileId = bare.profile.info_id
            info.placement.start, info.placement.size = bare.start, bare.profile.memory_slices
        else:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        result: GpuInstanceInfo = info
        return result

    @pynvml_function
    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: DeviceHandle, profile: int, version: int = 2
    ) -> GpuInstanceProfileInfo:
        gpu, mig = self._device(device)
        if mig or not gpu.mig_capable:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        known = profile_by_index(gpu, profile)
        if known is not None:
            return self._profile_info(gpu, known)
        # Outside the tables (A30, -me/+gfx variants) the simulator describes the profiles the node file uses.
        used = next((m for m in gpu.mig if profile_id_for(m.gpu_slices, m.suffix) == profile), None)
        if used is None:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info: Any = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id = self._profile_info_id(gpu, used)
        info.sliceCount = used.gpu_slices
        info.instanceCount = 1
        info.memorySizeMB = self._mig_memory_mb(gpu, used)
        result: GpuInstanceProfileInfo = info
        return result

    def _profile_info(self, gpu: GpuSpec, profile: GiProfile) -> GpuInstanceProfileInfo:
        """What NVML says of one profile of the table: what a MIG device of it reports as its attributes."""
        like = profile_template(gpu, profile)
        engines = _mig_engines(like)
        info: Any = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id = profile.info_id
        info.sliceCount = profile.gpu_slices
        info.instanceCount = profile.instance_count
        info.multiprocessorCount = sms_per_slice(gpu) * profile.gpu_slices
        info.copyEngineCount, info.decoderCount, info.encoderCount = engines[0], engines[1], engines[2]
        info.jpegCount, info.ofaCount = engines[3], engines[4]
        info.memorySizeMB = self._mig_memory_mb(gpu, like)
        info.name = f"MIG {like.profile}".encode()
        result: GpuInstanceProfileInfo = info
        return result

    @pynvml_function
    def nvmlDeviceGetGpuInstanceId(self, device: DeviceHandle) -> int:
        gpu, mig = self._device(device)
        if not mig:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig_instance_ids(gpu, mig)[0]

    @pynvml_function
    def nvmlDeviceGetComputeInstanceId(self, device: DeviceHandle) -> int:
        gpu, mig = self._device(device)
        if not mig:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig_instance_ids(gpu, mig)[1]

    @pynvml_function
    def nvmlDeviceGetAttributes(self, device: DeviceHandle) -> DeviceAttributes:
        gpu, mig = self._device(device)
        attrs: DeviceAttributes = pynvml.c_nvmlDeviceAttributes()
        if mig:
            attrs.gpuInstanceSliceCount = mig.gpu_slices
            attrs.computeInstanceSliceCount = mig.compute_slices
            attrs.multiprocessorCount = sms_per_slice(gpu) * mig.compute_slices
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


def sms_per_slice(gpu: GpuSpec) -> int:
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


def instance_placement(gpu: GpuSpec, mig: MigSpec) -> tuple[int, int]:
    """(start, size) of `mig`'s GPU instance, in its layout (node.py refused layouts no placement fits), or
    where it was made (or pinned when another instance was made or destroyed)."""
    if mig.placement is not None:
        return mig.placement
    memory_total, compute_total = gpu_slices(gpu.name)
    total_gb = -(-gpu.memory_mib // 1024)
    instances = [(m.gpu_slices, memory_slices(m.memory_gb, total_gb, memory_total)) for m in gpu.mig]
    placements = fit_placements(instances, memory_total, compute_total)
    if placements is None:  # a NodeSpec built by hand, past the node file's check
        raise _nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    return placements[gpu.mig.index(mig)]

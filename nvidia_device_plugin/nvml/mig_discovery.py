"""The MIG devices of one GPU in MIG mode: handles, profile names from profile IDs, capability minors.

Empty slots are normal (the index space has gaps after instances are destroyed): NOT_FOUND and
INVALID_ARGUMENT both mean "no device here". NO_PERMISSION is what an unprivileged container gets: the
GPU is then served without MIG devices and the problem says CAP_SYS_ADMIN is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pynvml

from nvidia_device_plugin.devices import Gpu, MigAttributes, MigDevice
from nvidia_device_plugin.nvml.api import DeviceHandle
from nvidia_device_plugin.nvml.errors import NvmlErrorKind, classify, error_code, nvml_error
from nvidia_device_plugin.nvml.mig_profiles import (
    GPU_INSTANCE_PROFILES,
    CapsMinors,
    mig_profile_name,
    resolve_caps_minors,
)
from nvidia_device_plugin.nvml.reader import Reader, raise_if_lost

_EMPTY_SLOT = frozenset({NvmlErrorKind.NOT_FOUND, NvmlErrorKind.INVALID_ARGUMENT})
# NO_PERMISSION while enumerating MIG devices, in the operator's words: which capability it takes.
NO_PERMISSION_MIG = (
    "no permission to enumerate MIG devices: in a container this needs CAP_SYS_ADMIN (run the plugin "
    "privileged, or add the SYS_ADMIN capability)"
)


def read_mig_devices(
    reader: Reader, handle: DeviceHandle, gpu: Gpu, proc_root: Path | None, caps: CapsMinors
) -> tuple[MigDevice, ...]:
    nv = reader.nv
    index = gpu.index
    what = f"reading MIG devices of GPU {index}"
    devices = []
    for j in range(_max_mig_devices(reader, handle, index, what)):
        try:
            mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
        except pynvml.NVMLError as exc:
            if classify(exc) in _EMPTY_SLOT:
                continue
            raise_if_lost(exc, "nvmlDeviceGetMigDeviceHandleByIndex")
            _mig_problem(reader, index, "nvmlDeviceGetMigDeviceHandleByIndex", exc, what)
            if classify(exc) is NvmlErrorKind.NO_PERMISSION:
                break  # every slot will say the same
            continue
        device = _mig_device(reader, handle, mig, gpu, j, proc_root, caps)
        if device is not None:
            devices.append(device)
    return tuple(devices)


def _mig_device(
    reader: Reader,
    parent: DeviceHandle,
    mig: DeviceHandle,
    gpu: Gpu,
    j: int,
    proc_root: Path | None,
    caps: CapsMinors,
) -> MigDevice | None:
    nv = reader.nv
    what = f"reading MIG device {gpu.index}:{j}"
    try:
        uuid = nv.nvmlDeviceGetUUID(mig)
        attrs = nv.nvmlDeviceGetAttributes(mig)
        memory = nv.nvmlDeviceGetMemoryInfo(mig).total
        gi = int(nv.nvmlDeviceGetGpuInstanceId(mig))
        ci = int(nv.nvmlDeviceGetComputeInstanceId(mig))
    except pynvml.NVMLError as exc:
        raise_if_lost(exc, "reading a MIG device")
        _mig_problem(reader, gpu.index, "reading a MIG device", exc, what)
        return None
    instance = _gpu_instance(reader, parent, gpu.index, gi)
    profile_id, profile_memory_mb = instance.profile_id, instance.memory_mb
    slices, suffix = (
        GPU_INSTANCE_PROFILES.get(profile_id, (int(attrs.gpuInstanceSliceCount), ""))
        if profile_id is not None
        else (int(attrs.gpuInstanceSliceCount), "")
    )
    memory_mb = profile_memory_mb or int(attrs.memorySizeMB)
    return MigDevice(
        uuid=uuid,
        index=j,
        parent_uuid=gpu.uuid,
        parent_index=gpu.index,
        profile=mig_profile_name(
            slices, int(attrs.computeInstanceSliceCount), memory_mb, gpu.memory_bytes, suffix
        )
        if gpu.memory_bytes
        else f"{slices}g.unknown",
        memory_bytes=memory,
        gpu_instance_id=gi,
        compute_instance_id=ci,
        profile_id=profile_id,
        gi_profile_info_id=instance.info_id,
        placement=instance.placement,
        caps_minors=resolve_caps_minors(caps, proc_root, gpu.minor, gi, ci)
        if proc_root is not None
        else None,
        attributes=MigAttributes(
            memory_mb=int(attrs.memorySizeMB),
            multiprocessors=int(attrs.multiprocessorCount),
            gpu_instance_slices=int(attrs.gpuInstanceSliceCount),
            compute_instance_slices=int(attrs.computeInstanceSliceCount),
            copy_engines=int(attrs.sharedCopyEngineCount),
            decoders=int(attrs.sharedDecoderCount),
            encoders=int(attrs.sharedEncoderCount),
            jpeg_decoders=int(attrs.sharedJpegCount),
            ofa_engines=int(attrs.sharedOfaCount),
        ),
    )


@dataclass(frozen=True)
class _GpuInstance:
    """What NVML says of one GPU instance; Nones (and 0) where it would not say."""

    profile_id: int | None = None  # the nvmlGpuInstanceProfile index
    memory_mb: int = 0  # the profile's memory
    info_id: int | None = None  # nvmlGpuInstanceInfo_t.profileId
    placement: tuple[int, int] | None = None  # (start, size)


def _gpu_instance(reader: Reader, parent: DeviceHandle, index: int, gi: int) -> _GpuInstance:
    """GPU instance `gi`'s profile (as go-nvlib finds it) and placement; the profile is unknown when NVML
    will not say (the name then comes from the device attributes, without +me/+gfx)."""
    nv = reader.nv
    try:
        info = nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(parent, gi))
        wanted = int(info.profileId)
        placement = (int(info.placement.start), int(info.placement.size))
    except pynvml.NVMLError as exc:
        raise_if_lost(exc, "nvmlDeviceGetGpuInstanceById")
        reader.note(
            index,
            "nvmlDeviceGetGpuInstanceById",
            error_code(exc),
            f"{nvml_error(exc, f'reading the MIG profile IDs of GPU {index}')}; MIG profiles are named "
            "from device attributes, without +me/+gfx attributes",
        )
        return _GpuInstance()
    for profile in GPU_INSTANCE_PROFILES:
        try:
            profile_info = nv.nvmlDeviceGetGpuInstanceProfileInfo(parent, profile)
        except pynvml.NVMLError:
            continue  # profiles this GPU does not have answer NOT_SUPPORTED / INVALID_ARGUMENT
        if int(profile_info.id) == wanted:
            return _GpuInstance(profile, int(profile_info.memorySizeMB), wanted, placement)
    return _GpuInstance(info_id=wanted, placement=placement)


def _max_mig_devices(reader: Reader, handle: DeviceHandle, index: int, what: str) -> int:
    """How many MIG device slots to look at; 0 when NVML cannot say (a problem, unless NOT_SUPPORTED)."""
    try:
        return int(reader.nv.nvmlDeviceGetMaxMigDeviceCount(handle))
    except pynvml.NVMLError as exc:
        raise_if_lost(exc, "nvmlDeviceGetMaxMigDeviceCount")
        if classify(exc) is not NvmlErrorKind.NOT_SUPPORTED:
            _mig_problem(reader, index, "nvmlDeviceGetMaxMigDeviceCount", exc, what)
        return 0


def _mig_problem(reader: Reader, index: int, call: str, exc: pynvml.NVMLError, what: str) -> None:
    code = error_code(exc)
    if classify(exc) is NvmlErrorKind.NO_PERMISSION:
        message = (
            f"{what}: {NO_PERMISSION_MIG} (NVML error {code}); GPU {index} is served without MIG devices"
        )
    else:
        message = f"{nvml_error(exc, what)}; that MIG device is left out"
    reader.note(index, call, code, message)

"""Where GPU instances can be made on a GPU in MIG mode: every possible placement of every GPU-instance
profile it supports (Gpu.mig_placements), what dynamic MIG publishes and creates.

A profile is asked for by its index (NVML_GPU_INSTANCE_PROFILE_*); NVML's answer names it by its own `id`
(19 for 1g.10gb on A100), which the placement, create and GPU-instance calls take. A profile the GPU does
not have answers NOT_SUPPORTED (or INVALID_ARGUMENT) and is skipped; any other failure leaves that
profile's placements out and says so as a DiscoveryProblem, as the other MIG reads do.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pynvml

from nvidia_device_plugin.devices import Gpu, MigAttributes, MigPlacementOption
from nvidia_device_plugin.nvml.api import DeviceHandle, GpuInstanceProfileInfo, NvmlApi
from nvidia_device_plugin.nvml.errors import ABSENT, NvmlErrorKind, classify, error_code, nvml_error
from nvidia_device_plugin.nvml.mig_profiles import GPU_INSTANCE_PROFILES, mig_profile_name
from nvidia_device_plugin.nvml.reader import Reader, raise_if_lost

# The most placements one profile may list: a GPU has at most 8 memory slices, so 8 placements; a count
# past this is refused as garbage rather than sized into an array.
MAX_PLACEMENTS_PER_PROFILE = 32
_MIB = 1024 * 1024


class TooManyPlacements(pynvml.NVMLError):  # type: ignore[misc]  # pynvml is untyped
    """NVML said a profile has more placements than MAX_PLACEMENTS_PER_PROFILE."""

    def __new__(cls, count: int) -> TooManyPlacements:
        obj: TooManyPlacements = Exception.__new__(cls)
        obj.value = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        return obj

    def __init__(self, count: int) -> None:
        super().__init__(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        self.count = count

    def __str__(self) -> str:
        return f"NVML lists {self.count} placements for one profile, more than {MAX_PLACEMENTS_PER_PROFILE}"


def possible_placements(nv: NvmlApi, handle: DeviceHandle, profile_id: int) -> list[tuple[int, int]]:
    """(start, size) of every possible placement of GPU-instance profile `profile_id` (the profile info's
    `id`), as nvidia-smi mig -lgipp lists them: NVML counts them first, then fills an array that size."""
    count = ctypes.c_uint(0)
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
    if count.value > MAX_PLACEMENTS_PER_PROFILE:
        raise TooManyPlacements(count.value)
    if count.value == 0:
        return []
    placements = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, placements, ctypes.byref(count))
    return [(int(p.start), int(p.size)) for p in placements[: min(count.value, len(placements))]]


def supported_profiles(nv: NvmlApi, handle: DeviceHandle) -> Iterator[tuple[int, GpuInstanceProfileInfo]]:
    """(profile index, NVML's profile info) of each GPU-instance profile the GPU has; other errors raise."""
    for index in GPU_INSTANCE_PROFILES:
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except pynvml.NVMLError as exc:
            if classify(exc) in ABSENT:
                continue
            raise
        yield index, info


def read_mig_placements(
    reader: Reader, handle: DeviceHandle, gpu: Gpu
) -> tuple[tuple[MigPlacementOption, ...], int]:
    """Gpu.mig_placements and Gpu.mig_memory_slices (the memory slices they span, 8 on A100/H100)."""
    options: list[MigPlacementOption] = []
    for index in GPU_INSTANCE_PROFILES:
        info = _profile_info(reader, handle, gpu.index, index)
        if info is None:
            continue
        for start, size in _placements(reader, handle, gpu.index, info):
            options.append(_option(gpu, index, info, start, size))
    return tuple(options), max((o.start + o.size for o in options), default=0)


def _profile_info(
    reader: Reader, handle: DeviceHandle, gpu: int, index: int
) -> GpuInstanceProfileInfo | None:
    try:
        return reader.nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
    except pynvml.NVMLError as exc:
        kind = classify(exc)
        if kind is NvmlErrorKind.STUCK:
            raise_if_lost(exc, "nvmlDeviceGetGpuInstanceProfileInfo")
        # A profile this GPU lacks is no problem. GPU_IS_LOST from a profile's info does not take the GPU
        # out: MIG device discovery (mig_discovery.py) reads these infos the same way.
        if kind not in ABSENT:
            _problem(reader, gpu, "nvmlDeviceGetGpuInstanceProfileInfo", exc, f"GPU-instance profile {index}")
        return None


def _placements(
    reader: Reader, handle: DeviceHandle, gpu: int, info: GpuInstanceProfileInfo
) -> list[tuple[int, int]]:
    call = "nvmlDeviceGetGpuInstancePossiblePlacements"
    try:
        return possible_placements(reader.nv, handle, int(info.id))
    except pynvml.NVMLError as exc:
        if classify(exc) not in ABSENT:
            raise_if_lost(exc, call)
            _problem(reader, gpu, call, exc, f"GPU-instance profile ID {int(info.id)}")
        return []


def _problem(reader: Reader, gpu: int, call: str, exc: pynvml.NVMLError, profile: str) -> None:
    what = f"reading the possible MIG placements of {profile} on GPU {gpu}"
    message = f"{nvml_error(exc, what)}; that profile's placements are left out"
    reader.note(gpu, call, error_code(exc), message)


def _option(gpu: Gpu, index: int, info: GpuInstanceProfileInfo, start: int, size: int) -> MigPlacementOption:
    slices, suffix = GPU_INSTANCE_PROFILES[index]
    memory_mb = int(info.memorySizeMB)
    name = (
        mig_profile_name(slices, slices, memory_mb, gpu.memory_bytes, suffix)
        if gpu.memory_bytes
        else f"{slices}g.unknown"
    )
    return MigPlacementOption(
        profile=name,
        gi_profile_id=int(info.id),
        start=start,
        size=size,
        memory_bytes=memory_mb * _MIB,
        multiprocessors=int(info.multiprocessorCount),
        attributes=MigAttributes(
            memory_mb=memory_mb,
            multiprocessors=int(info.multiprocessorCount),
            gpu_instance_slices=int(info.sliceCount),
            compute_instance_slices=int(info.sliceCount),
            copy_engines=int(info.copyEngineCount),
            decoders=int(info.decoderCount),
            encoders=int(info.encoderCount),
            jpeg_decoders=int(info.jpegCount),
            ofa_engines=int(info.ofaCount),
        ),
    )

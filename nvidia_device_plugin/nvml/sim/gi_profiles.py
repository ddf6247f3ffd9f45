"""NVIDIA's GPU-instance profile tables, as the simulated driver answers them: profile IDs, slices and the
possible placements `nvidia-smi mig -lgip` and `-lgipp` list.

A100 (40 and 80 GB), H100, H200 and B200 share one table: 8 memory and 7 compute slices, the same profile
IDs (19: 1g, 20: 1g+me, 15: 1g with two memory slices, 14: 2g, 9: 3g, 5: 4g, 0: 7g) and placements at
multiples of the profile's memory slices where its compute slices still fit (NVIDIA's MIG user guide,
"Supported MIG Profiles"); only the memory in the names differs (1g.10gb on A100-80GB, 1g.18gb on H200).
Other GPUs (A30) and the attribute variants the table lacks (-me, +gfx, +me.all) keep the simulator's own
IDs: the profile index plus PLACEHOLDER_ID_OFFSET, so no test can take them for NVIDIA's.
"""

from __future__ import annotations

from dataclasses import dataclass

import pynvml

from nvidia_device_plugin.nvml.sim.node import GpuSpec, MigSpec
from nvidia_device_plugin.nvml.sim.placement import gpu_slices, memory_slices

PLACEHOLDER_ID_OFFSET = 100


@dataclass(frozen=True)
class GiProfile:
    """One GPU-instance profile of a GPU: what nvmlDeviceGetGpuInstanceProfileInfo and
    nvmlDeviceGetGpuInstancePossiblePlacements answer for it."""

    index: int  # pynvml's NVML_GPU_INSTANCE_PROFILE_* (what the profile-info call takes)
    info_id: int  # NVIDIA's profile ID (what placements, create and nvmlGpuInstanceGetInfo use)
    gpu_slices: int  # compute slices ("1g")
    memory_slices: int  # the placement's size
    suffix: str  # "+me", or ""
    instance_count: int  # how many the GPU holds at most
    starts: tuple[int, ...]  # the possible placements' first memory slices


_P = pynvml
# 8 memory slices, 7 compute slices: A100-40GB/80GB, H100, H200, B200 (and GB200).
EIGHT_SLICE_PROFILES: tuple[GiProfile, ...] = (
    GiProfile(_P.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 1, "", 7, (0, 1, 2, 3, 4, 5, 6)),
    GiProfile(_P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, "+me", 1, (0, 1, 2, 3, 4, 5, 6)),
    GiProfile(_P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 2, "", 4, (0, 2, 4, 6)),
    GiProfile(_P.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 2, "", 3, (0, 2, 4)),
    GiProfile(_P.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 4, "", 2, (0, 4)),
    GiProfile(_P.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 4, "", 1, (0,)),
    GiProfile(_P.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 8, "", 1, (0,)),
)


def gi_profiles(gpu: GpuSpec) -> tuple[GiProfile, ...]:
    """The profile table of a MIG-capable GPU; () for GPUs the simulator has no table of (A30)."""
    if not gpu.mig_capable or gpu_slices(gpu.name) != (8, 7):
        return ()
    return EIGHT_SLICE_PROFILES


def profile_by_index(gpu: GpuSpec, index: int) -> GiProfile | None:
    return next((p for p in gi_profiles(gpu) if p.index == index), None)


def profile_by_id(gpu: GpuSpec, info_id: int) -> GiProfile | None:
    return next((p for p in gi_profiles(gpu) if p.info_id == info_id), None)


def profile_of(gpu: GpuSpec, mig: MigSpec) -> GiProfile | None:
    """The table's profile of a MIG device (by slices, memory slices and attributes); None outside it."""
    memory_total, _ = gpu_slices(gpu.name)
    size = memory_slices(mig.memory_gb, _total_gb(gpu), memory_total)
    return next(
        (
            p
            for p in gi_profiles(gpu)
            if (p.gpu_slices, p.memory_slices, p.suffix) == (mig.gpu_slices, size, mig.suffix)
        ),
        None,
    )


def profile_memory_gb(gpu: GpuSpec, profile: GiProfile) -> int:
    """The "<n>gb" of the profile's name: its share of the GPU's memory in whole GB, rounded half away from
    zero as NVIDIA names profiles (4 of 8 slices of a 141 GB H200: 3g.71gb)."""
    memory_total, _ = gpu_slices(gpu.name)
    twice = 2 * profile.memory_slices * _total_gb(gpu)
    return (twice // memory_total + 1) // 2


def profile_template(gpu: GpuSpec, profile: GiProfile, compute_slices: int | None = None) -> MigSpec:
    """A MIG device of `profile` on `gpu` (no UUID, slot or placement yet): what one made of it is."""
    gb = profile_memory_gb(gpu, profile)
    compute = profile.gpu_slices if compute_slices is None else compute_slices
    name = f"{profile.gpu_slices}g.{gb}gb{profile.suffix}"
    return MigSpec(
        profile=name if compute == profile.gpu_slices else f"{compute}c.{name}",
        uuid="",
        gpu_slices=profile.gpu_slices,
        compute_slices=compute,
        memory_gb=gb,
        suffix=profile.suffix,
    )


def _total_gb(gpu: GpuSpec) -> int:
    return -(-gpu.memory_mib // 1024)

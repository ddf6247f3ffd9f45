"""MIG profile names as NVIDIA's tools spell them, and the MIG capability minors of the driver.

Names ("1g.10gb", "1c.3g.40gb", "1g.10gb+me") follow go-nvlib's MigProfileInfo: the GPU-instance
profile ID says the slices and the attributes (+me media extensions, -me none, +gfx graphics, +me.all
all media engines), the compute-instance slice count prefixes "<c>c." when it differs, and the memory
figure is the instance's share of the GPU rounded up to eighths, times the GPU's memory in whole GB,
rounded half away from zero (Go's math.Round). Python's round() rounds ties to even, which turned H200's
3g.71gb into 3g.70gb and B200's 1g.23gb into 1g.22gb.

Capability minors: a MIG device is reached through /dev/nvidia-caps/nvidia-cap<N>, one N for its GPU
instance and one for its compute instance. The driver lists them in <proc>/driver/nvidia-caps/mig-minors
("gpu0/gi1/access 12", "gpu0/gi1/ci0/access 13"); the NVIDIA container runtime masks
<proc>/driver/nvidia/capabilities/ inside containers, so that tree ("DeviceFileMinor: 12" in
gpu0/mig/gi1/access) is only a fallback.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pynvml

from nvidia_device_plugin.base.boundedio import SMALL_FILE_BYTES, read_text

# GPU-instance profile ID (nvmlGpuInstanceProfile index) -> (slices, attribute suffix).
_P = pynvml
GPU_INSTANCE_PROFILES: dict[int, tuple[int, str]] = {
    _P.NVML_GPU_INSTANCE_PROFILE_1_SLICE: (1, ""),
    _P.NVML_GPU_INSTANCE_PROFILE_2_SLICE: (2, ""),
    _P.NVML_GPU_INSTANCE_PROFILE_3_SLICE: (3, ""),
    _P.NVML_GPU_INSTANCE_PROFILE_4_SLICE: (4, ""),
    _P.NVML_GPU_INSTANCE_PROFILE_7_SLICE: (7, ""),
    _P.NVML_GPU_INSTANCE_PROFILE_8_SLICE: (8, ""),
    _P.NVML_GPU_INSTANCE_PROFILE_6_SLICE: (6, ""),
    _P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: (1, "+me"),
    _P.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1: (2, "+me"),
    _P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: (1, ""),  # 1g.20gb on A100-80GB: twice the memory
    _P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX: (1, "+gfx"),
    _P.NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX: (2, "+gfx"),
    _P.NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX: (4, "+gfx"),
    _P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME: (1, "-me"),
    _P.NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME: (2, "-me"),
    _P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME: (1, "+me.all"),
    _P.NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME: (2, "+me.all"),
    _P.NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX: (3, "+gfx"),
}
ATTRIBUTE_SUFFIXES = ("+me.all", "+me", "-me", "+gfx")  # longest first, for parsing


def profile_id_for(slices: int, suffix: str) -> int:
    """The GPU-instance profile ID of `slices` with `suffix` (the plain one for "" : not REV2)."""
    for profile_id, (s, attr) in GPU_INSTANCE_PROFILES.items():
        if s == slices and attr == suffix and profile_id != _P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2:
            return profile_id
    raise ValueError(f"no MIG GPU-instance profile with {slices} slices and attributes {suffix!r}")


def mig_memory_gb(memory_mb: int, gpu_memory_bytes: int) -> int:
    """The "<n>gb" figure of a MIG profile name (go-nvlib's getMigMemorySizeGB)."""
    fraction = math.ceil(memory_mb * 1024 * 1024 / gpu_memory_bytes * 8) / 8
    total_gb = -(-gpu_memory_bytes // (1024**3))
    # Half away from zero, as Go's math.Round: the product of eighths is exact in binary floating point.
    # decimal is imported here: only a node with MIG devices needs it (its C module costs start-up memory).
    from decimal import ROUND_HALF_UP, Decimal

    return int(Decimal(fraction * total_gb).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def mig_profile_name(
    gpu_slices: int, compute_slices: int, memory_mb: int, gpu_memory_bytes: int, suffix: str = ""
) -> str:
    """NVIDIA's MIG profile name ("1g.10gb", "1c.2g.20gb", "1g.10gb+me") from a MIG device's facts."""
    gb = mig_memory_gb(memory_mb, gpu_memory_bytes)
    base = f"{gpu_slices}g.{gb}gb{suffix}"
    return base if compute_slices == gpu_slices else f"{compute_slices}c.{base}"


# ---- capability minors ----------------------------------------------------------------------------

# One line per possible GPU / GPU instance / compute instance: about 100 KiB on a real driver.
MAX_MIG_MINORS_BYTES = 1024 * 1024
_MINOR_LINE = re.compile(r"^gpu(\d+)/gi(\d+)(?:/ci(\d+))?/access\s+(\d+)$")
CapsMinors = dict[tuple[int, int, int | None], int]  # (GPU minor, GI, CI or None) -> nvidia-cap minor


def read_mig_minors(proc_root: Path) -> CapsMinors:
    """<proc>/driver/nvidia-caps/mig-minors, parsed; empty when the file is absent or unreadable."""
    try:
        text = read_text(proc_root / "driver" / "nvidia-caps" / "mig-minors", MAX_MIG_MINORS_BYTES)
    except (OSError, ValueError):
        return {}
    minors: CapsMinors = {}
    for line in text.splitlines():
        match = _MINOR_LINE.match(line.strip())
        if match:
            gpu, gi, ci, minor = match.groups()
            minors[(int(gpu), int(gi), None if ci is None else int(ci))] = int(minor)
    return minors


def read_capability_access(proc_root: Path, gpu_minor: int, gi: int, ci: int | None) -> int | None:
    """The minor from <proc>/driver/nvidia/capabilities/gpu<m>/mig/gi<g>[/ci<c>]/access, if readable."""
    path = proc_root / "driver" / "nvidia" / "capabilities" / f"gpu{gpu_minor}" / "mig" / f"gi{gi}"
    if ci is not None:
        path = path / f"ci{ci}"
    try:
        text = read_text(path / "access", SMALL_FILE_BYTES)
    except (OSError, ValueError):
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value.strip())
    return None


def resolve_caps_minors(
    minors: CapsMinors, proc_root: Path, gpu_minor: int, gi: int, ci: int
) -> tuple[int, int] | None:
    """(GI cap minor, CI cap minor) of one MIG device from mig-minors, else the capabilities tree."""
    found = []
    for key_ci in (None, ci):
        minor = minors.get((gpu_minor, gi, key_ci))
        if minor is None:
            minor = read_capability_access(proc_root, gpu_minor, gi, key_ci)
        if minor is None:
            return None
        found.append(minor)
    return found[0], found[1]

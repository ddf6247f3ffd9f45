"""Where the simulated GPU instances sit on their GPU: NVML's GPU-instance placements (start, size).

A MIG-capable GPU has memory slices (8 on A100/H100/H200/B200, 4 on A30) and compute slices (7, or 4). A
GPU instance occupies `size` consecutive memory slices from `start`, where `size` is its share of the
memory in slices and `start` a multiple of `size`, and its compute slices from the same start must fit
too: so on an 8-slice GPU a 1g profile may start at 0..6, a 2g at 0, 2 or 4, a 3g (4 memory slices) at 0
or 4, a 4g at 0 and a 7g at 0 (what `nvidia-smi mig -lgipp` lists). Real hardware cannot hold a layout
no placement fits, so a node file describing one is refused (`fit_placements` returns None and the node
parser names the GPU). Placements are chosen larger instances first, lowest start first, backtracking:
one valid layout, stable for a given node file (the driver keeps its own choice as stable).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nvidia_device_plugin.base.errors import ConfigError

# GPUs with 4 memory and 4 compute slices; every other MIG-capable GPU has 8 and 7.
_FOUR_SLICE_GPUS = re.compile(r"A30\b")


def gpu_slices(gpu_name: str) -> tuple[int, int]:
    """(memory slices, compute slices) of a MIG-capable GPU by product name."""
    return (4, 4) if _FOUR_SLICE_GPUS.search(gpu_name) else (8, 7)


def memory_slices(memory_gb: int, gpu_memory_gb: int, total_memory_slices: int) -> int:
    """How many memory slices a profile's memory takes ("3g.40gb" on an 80 GB GPU: 4 of 8)."""
    return max(1, round(memory_gb * total_memory_slices / max(gpu_memory_gb, 1)))


def fit_placements(
    instances: Sequence[tuple[int, int]], memory_total: int, compute_total: int
) -> list[tuple[int, int]] | None:
    """A placement (start, size) for each instance (compute slices, memory slices), in the given order;
    None when no placement of all of them exists."""
    order = sorted(range(len(instances)), key=lambda k: (-instances[k][1], k))
    chosen: dict[int, tuple[int, int]] = {}
    used = [False] * memory_total

    def place(position: int) -> bool:
        if position == len(order):
            return True
        k = order[position]
        compute, size = instances[k]
        for start in range(0, memory_total, size):
            span = range(start, start + size)
            if start + size > memory_total or start + compute > compute_total or any(used[s] for s in span):
                continue
            for s in span:
                used[s] = True
            chosen[k] = (start, size)
            if place(position + 1):
                return True
            for s in span:
                used[s] = False
        return False

    if not place(0):
        return None
    return [chosen[k] for k in range(len(instances))]


def check_layout(
    gpu_name: str, gpu_memory_gb: int, profiles: Sequence[tuple[str, int, int]], where: str
) -> None:
    """Refuse a node file's MIG layout (profile, GPU slices, memory GB per instance) no placement fits."""
    memory_total, compute_total = gpu_slices(gpu_name)
    instances = [(g, memory_slices(gb, gpu_memory_gb, memory_total)) for _, g, gb in profiles]
    if instances and fit_placements(instances, memory_total, compute_total) is None:
        names = ", ".join(profile for profile, _, _ in profiles)
        raise ConfigError(
            f"{where}: MIG devices {names} do not fit together on one {gpu_name} ({memory_total} memory "
            f"and {compute_total} compute slices): no GPU-instance placement holds them all"
        )

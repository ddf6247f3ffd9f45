"""The `dra` section (ours; NVIDIA's v0.20 has none and warns that the key is unknown): whether the daemon
also serves Dynamic Resource Allocation (resource.k8s.io/v1) and which GPUs DRA owns.

    dra:
      enabled: true      # default false: the daemon is the device plugin it always was
      gpus: all          # or a list of GPU indices / UUIDs ([0, "GPU-8a3c..."]); the rest stay with the
                         # device plugin; [] serves DRA with no GPU yet (installed, nothing moved)
      dynamicMig: true   # default false: a DRA-owned GPU in MIG mode publishes every possible MIG
                         # placement as a partition (KEP-4815 counters) instead of its MIG devices

A GPU is owned by one side at a time (dra/ownership.py): a DRA-owned GPU is in no ListAndWatch, a
device-plugin-owned GPU in no ResourceSlice. The owner is per physical GPU, so MIG references ("0:1") are
refused: a GPU's MIG devices go with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ALL_GPUS: Literal["all"] = "all"


@dataclass(frozen=True)
class Dra:
    """The config's `dra` section: whether this daemon serves GPUs through DRA, and which."""

    enabled: bool = False
    # Which GPUs DRA owns while enabled: every one, or these refs (GPU index "0", or a lower-cased UUID).
    gpus: Literal["all"] | tuple[str, ...] = ALL_GPUS
    # Dynamic MIG (dra/kinds/partition.py): DRA-owned GPUs in MIG mode publish their possible placements.
    dynamic_mig: bool = False

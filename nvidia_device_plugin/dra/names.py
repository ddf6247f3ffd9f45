"""The one place DRA device names are made and resolved: names as NVIDIA's DRA driver publishes them.

A whole GPU is `gpu-<minor>` (the minor of /dev/nvidia<minor>, which does not shift when another GPU drops,
unlike the index). A static MIG device is `gpu-<parent minor>-mig-<GI profile ID>-<placement start>-
<placement size>`: its physical configuration, stable across restarts. Both the slices (what is published)
and the kubelet plugin (what a claim's result names) read this module, so the two never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvidia_device_plugin.devices import Gpu, Inventory, MigDevice

DRIVER_NAME = "gpu.nvidia.com"


def gpu_device_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}"


def mig_device_name(parent: Gpu, profile_id: int, placement_start: int, placement_size: int) -> str:
    return f"gpu-{parent.minor}-mig-{profile_id}-{placement_start}-{placement_size}"


@dataclass(frozen=True)
class DraDevice:
    """What a published DRA device name stands for on this node."""

    name: str
    gpu: Gpu
    mig: MigDevice | None = None

    @property
    def uuid(self) -> str:
        return self.mig.uuid if self.mig is not None else self.gpu.uuid


def whole_gpus(inventory: Inventory) -> dict[str, DraDevice]:
    """Every GPU of `inventory` by its DRA name (MIG devices are added by the slice code, which knows
    their placements)."""
    return {gpu_device_name(g): DraDevice(gpu_device_name(g), g) for g in inventory.gpus}

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


def mig_name_of(parent: Gpu, mig: MigDevice) -> str | None:
    """`mig`'s DRA name; None where NVML would not give its profile ID or placement (it is not published)."""
    if mig.gi_profile_info_id is None or mig.placement is None:
        return None
    return mig_device_name(parent, mig.gi_profile_info_id, *mig.placement)


def published_devices(inventory: Inventory) -> dict[str, DraDevice]:
    """Every device DRA names on this node, by name, in GPU then MIG order: a GPU in MIG mode is its MIG
    devices (a whole GPU in MIG mode runs no CUDA work), any other GPU is itself, as NVIDIA's DRA driver
    publishes static MIG. A MIG device without a name (see mig_name_of) is left out."""
    devices: dict[str, DraDevice] = {}
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        if not gpu.mig_enabled:
            devices[gpu_device_name(gpu)] = DraDevice(gpu_device_name(gpu), gpu)
            continue
        for mig in gpu.mig_devices:
            name = mig_name_of(gpu, mig)
            if name is not None:
                devices[name] = DraDevice(name, gpu, mig)
    return devices

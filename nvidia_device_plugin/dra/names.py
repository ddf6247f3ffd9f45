"""The one place DRA device names are made and resolved: names as NVIDIA's DRA driver publishes them.

Each kind of device names its own (dra/kinds/: a whole GPU is `gpu-<minor>`, a static MIG device
`gpu-<parent minor>-mig-<profile without dots>-<GI profile ID>-<placement start>`); this module says which
kinds this node publishes and in what order. Both the slices (what is published) and the kubelet plugin
(what a claim's result names) read this module, so the two never disagree.
"""

from __future__ import annotations

from nvidia_device_plugin.devices import Gpu, Inventory
from nvidia_device_plugin.dra.kinds import DeviceKind, DraDevice
from nvidia_device_plugin.dra.kinds.gpu import GPU, gpu_device_name
from nvidia_device_plugin.dra.kinds.mig import MIG, mig_device_name, mig_name_of
from nvidia_device_plugin.dra.kinds.partition import PARTITION

DRIVER_NAME = "gpu.nvidia.com"
KINDS: tuple[DeviceKind, ...] = (GPU, MIG)  # a GPU's devices in this order (it publishes one kind)

__all__ = [
    "DRIVER_NAME",
    "KINDS",
    "DraDevice",
    "gpu_device_name",
    "kinds_of",
    "mig_device_name",
    "mig_name_of",
    "published_devices",
    "whole_gpus",
]


def whole_gpus(inventory: Inventory) -> dict[str, DraDevice]:
    """Every GPU of `inventory` by its DRA name, MIG mode or not (MIG devices are added by the slice code,
    which knows their placements)."""
    return {d.name: d for d in map(GPU.device, inventory.gpus)}


def kinds_of(gpu: Gpu, dynamic_mig: bool = False) -> tuple[DeviceKind, ...]:
    """The kinds `gpu` publishes: with dynamic MIG (`dra.dynamicMig`), a GPU in MIG mode whose placements are
    known publishes its partitions (dra/kinds/partition.py) and no whole GPU (in MIG mode it runs no CUDA
    work, and MIG mode changes need a GPU reset); otherwise `KINDS`."""
    return (PARTITION,) if dynamic_mig and PARTITION.applies(gpu) else KINDS


def published_devices(inventory: Inventory, dynamic_mig: bool = False) -> dict[str, DraDevice]:
    """Every device DRA names on this node, by name, in GPU then MIG order: a GPU in MIG mode is its MIG
    devices (a whole GPU in MIG mode runs no CUDA work), or with dynamic MIG its partitions; any other GPU
    is itself, as NVIDIA's DRA driver publishes static MIG. A MIG device without a name (see mig_name_of)
    is left out."""
    return {
        device.name: device
        for gpu in sorted(inventory.gpus, key=lambda g: g.index)
        for kind in kinds_of(gpu, dynamic_mig)
        for device in kind.devices(gpu)
    }

"""What the device plugin's config makes of each physical device: the resource name it goes under and
how it is shared, so DRA publishes the same node the device plugin would serve.

That is what makes the DeviceClasses (dra/classes.py) the config's own: a device carries
`resourceName` (the name its device-plugin resource has, e.g. `nvidia.com/mig-1g.10gb`), and each class
selects one name and asks for it with `extendedResourceName` (KEP-5004), so `nvidia.com/gpu: 1` means
in DRA what it meant to the device plugin. Shared devices (time-slicing, MPS) are published once,
shareable: consumable capacity `shares` counts their replicas (dra/attributes.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nvidia_device_plugin.config.sharing_modes import sharing_mode
from nvidia_device_plugin.config.v1 import SharingMode
from nvidia_device_plugin.dra.kinds import DraDevice
from nvidia_device_plugin.plans.resources import ResourcePlan


@dataclass(frozen=True)
class PluginView:
    """How the device plugin's config advertises one physical device (GPU or MIG UUID)."""

    resource: str  # e.g. "nvidia.com/gpu"
    sharing: SharingMode
    replicas: int  # replicas of it when shared, else 1


def plugin_views(plans: Sequence[ResourcePlan]) -> dict[str, PluginView]:
    """Physical UUID -> its view, from the plans built for the whole inventory (before ownership)."""
    views: dict[str, PluginView] = {}
    for plan in plans:
        for uuid, count in plan.devices_per_physical.items():
            views.setdefault(
                uuid,
                PluginView(
                    plan.name, plan.sharing, count if sharing_mode(plan.sharing).shares_devices else 1
                ),
            )
    return views


def view_of(device: DraDevice, views: dict[str, PluginView]) -> PluginView | None:
    """`device`'s view: its own, or, for a MIG device of a GPU the device plugin hands out whole (MIG
    strategy `none`), its GPU's resource name, unshared: DRA publishes such a GPU as its MIG devices, and
    the class serving that name must select them (dra/classes.py); each is one device, never more replicas
    than the device plugin gave the whole GPU."""
    own = views.get(device.uuid)
    if own is not None or device.mig is None:
        return own
    parent = views.get(device.gpu.uuid)
    return PluginView(parent.resource, "none", 1) if parent is not None else None

"""DeviceClasses from the plugin's own config: the classes a migration would otherwise write by hand.

Two rules shape them:

* NVIDIA's classes select every device of their type under every config: `gpu.nvidia.com` every whole GPU
  and `mig.nvidia.com` every MIG device, shared or not (a time-sliced GPU is still a GPU; a claim of it
  that asks no `shares` takes one, one that asks all of them has the GPU to itself, dra/attributes.py).
* Every resource name the device plugin advertises under this config is served by exactly one class, whose
  `extendedResourceName` (KEP-5004, DRAExtendedResource) is that name and whose selector picks the devices
  that carry it as `resourceName` (dra/sharing.py): a pod that keeps asking `nvidia.com/mig-1g.10gb: 1` is
  served from DRA on a node whose allocatable for that name is 0, which is what a node does whose GPUs DRA
  owns. Unshared `nvidia.com/gpu` goes to `gpu.nvidia.com` (whole GPUs, and under strategy `none` or
  `single` the MIG devices it names too) or, when it is MIG devices only (strategy `single`), to
  `mig.nvidia.com`. Any other name gets a class of its own: the resource's name without the domain, then
  `.nvidia.com` (`mig-1g.10gb.nvidia.com`); a shared resource's (time-slicing or MPS) gets `.shared`
  unless it has it already (`gpu.shared.nvidia.com`).

A shared class's devices (time-sliced or MPS) are shareable (consumable capacity): each claim takes one
share of the GPU's `replicas` and, unless it asks for some, none of its memory; an MPS claim is a client of
the config's control daemon for the GPU, with one replica's limits (dra/kubelet/claim_sharing.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.sharing_modes import sharing_mode
from nvidia_device_plugin.config.v1 import RESOURCE_PREFIX, SHARED_SUFFIX
from nvidia_device_plugin.dra.attributes import Json
from nvidia_device_plugin.dra.kinds.mig import MIG_CLASS
from nvidia_device_plugin.dra.names import DRIVER_NAME
from nvidia_device_plugin.dra.slices import API_VERSION
from nvidia_device_plugin.plans.resources import DEFAULT_GPU_RESOURCE, ResourcePlan

_ATTR = f'device.attributes["{DRIVER_NAME}"]'


def _selector(condition: str) -> list[Json]:
    return [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}" && {condition}'}}]


def _device_class(name: str, selectors: list[Json], extended: str | None) -> Json:
    spec: Json = {"selectors": selectors}
    if extended is not None:
        spec["extendedResourceName"] = extended
    return {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def _carrying(resource: str) -> str:
    return f'{_ATTR}.resourceName == "{resource}"'


def class_name(plan: ResourcePlan) -> str:
    """The class of one device-plugin resource: `nvidia.com/mig-1g.10gb` -> `mig-1g.10gb.nvidia.com`."""
    prefix, _, short = plan.name.rpartition("/")
    base = short if prefix == RESOURCE_PREFIX else plan.name.replace("/", ".")
    if sharing_mode(plan.sharing).shares_devices and not base.endswith(SHARED_SUFFIX):
        base += SHARED_SUFFIX
    return f"{base}.{RESOURCE_PREFIX}"


def _default_home(plans: Sequence[ResourcePlan]) -> str | None:
    """Which of NVIDIA's classes serves `nvidia.com/gpu`: where it is unshared, `mig.nvidia.com` when it
    is MIG devices only, else `gpu.nvidia.com`; None where it is shared (a class of its own) or not
    advertised."""
    default = next((p for p in plans if p.name == DEFAULT_GPU_RESOURCE), None)
    if default is None or sharing_mode(default.sharing).shares_devices:
        return None
    return MIG_CLASS if {d.kind for d in default.devices} == {"mig"} else DRIVER_NAME


def device_classes(plans: Sequence[ResourcePlan]) -> list[Json]:
    """Every class this config calls for, in name order."""
    home = _default_home(plans)
    gpu_condition = f'{_ATTR}.type == "gpu"'
    if home == DRIVER_NAME:  # under strategy none or single, MIG devices may carry nvidia.com/gpu too
        gpu_condition = f"({gpu_condition} || {_carrying(DEFAULT_GPU_RESOURCE)})"
    classes = {
        DRIVER_NAME: _device_class(
            DRIVER_NAME, _selector(gpu_condition), DEFAULT_GPU_RESOURCE if home == DRIVER_NAME else None
        ),
        MIG_CLASS: _device_class(
            MIG_CLASS,
            _selector(f'{_ATTR}.type == "mig"'),
            DEFAULT_GPU_RESOURCE if home == MIG_CLASS else None,
        ),
    }
    for plan in plans:
        if not sharing_mode(plan.sharing).dra_class:
            continue
        if plan.name == DEFAULT_GPU_RESOURCE and home is not None:
            continue
        name = class_name(plan)
        if name in classes:  # two resources, one class name: the config cannot be served through DRA
            raise ConfigError(
                f"resources {plan.name} and {_served_by(classes[name])} would both need DeviceClass {name}; "
                "rename one of them"
            )
        classes[name] = _device_class(name, _selector(_carrying(plan.name)), plan.name)
    return [classes[name] for name in sorted(classes)]


def _served_by(device_class: Json) -> str:
    return str(device_class["spec"].get("extendedResourceName") or device_class["metadata"]["name"])

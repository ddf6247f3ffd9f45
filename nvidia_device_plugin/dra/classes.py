"""DeviceClasses from the plugin's own config: the classes a migration would otherwise write by hand.

* `gpu.nvidia.com`: every whole GPU that is not shared (NVIDIA's class name and meaning);
  `mig.nvidia.com`: every MIG device that is not shared.
* One class per device-plugin resource this config serves (`nvidia.com/mig-1g.10gb` under the mixed
  strategy, a renamed `nvidia.com/a100`, a time-sliced `nvidia.com/gpu.shared`), selecting the devices
  that carry that `resourceName` (dra/sharing.py) and asking for it with `extendedResourceName`
  (KEP-5004, DRAExtendedResource): a pod that keeps asking `nvidia.com/mig-1g.10gb: 1` is served from
  DRA on a node whose allocatable for that name is 0, which is what a node does whose GPUs DRA owns.
  Its name is the resource's without the domain, then `.nvidia.com` (`mig-1g.10gb.nvidia.com`); a
  time-sliced resource's gets `.shared` unless it has it already. `nvidia.com/gpu` itself goes to
  `gpu.nvidia.com` when it is whole unshared GPUs (strategy none or mixed) and to `mig.nvidia.com` when
  it is MIG devices (strategy single).
* MPS resources get no class: MPS through DRA is not done (docs/dra.md); those GPUs are published
  unshared, under `gpu.nvidia.com`.

A time-sliced class's devices are shareable (consumable capacity): each claim takes one share of the
GPU's `replicas` and, unless it asks for some, none of its memory.
"""

from __future__ import annotations

from collections.abc import Sequence

from nvidia_device_plugin.config.sharing_modes import NO_SHARING, sharing_mode
from nvidia_device_plugin.config.v1 import RESOURCE_PREFIX, SHARED_SUFFIX
from nvidia_device_plugin.dra.attributes import Json
from nvidia_device_plugin.dra.kinds.mig import MIG_CLASS
from nvidia_device_plugin.dra.names import DRIVER_NAME
from nvidia_device_plugin.dra.slices import API_VERSION
from nvidia_device_plugin.plans.resources import DEFAULT_GPU_RESOURCE, ResourcePlan

_ATTR = f'device.attributes["{DRIVER_NAME}"]'
_UNSHARED = f'{_ATTR}.sharing == "{NO_SHARING.dra_attribute}"'


def _selector(*conditions: str) -> list[Json]:
    return [{"cel": {"expression": " && ".join([f'device.driver == "{DRIVER_NAME}"', *conditions])}}]


def _device_class(name: str, selectors: list[Json], extended: str | None) -> Json:
    spec: Json = {"selectors": selectors}
    if extended is not None:
        spec["extendedResourceName"] = extended
    return {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def class_name(plan: ResourcePlan) -> str:
    """The class of one device-plugin resource: `nvidia.com/mig-1g.10gb` -> `mig-1g.10gb.nvidia.com`."""
    prefix, _, short = plan.name.rpartition("/")
    base = short if prefix == RESOURCE_PREFIX else plan.name.replace("/", ".")
    if sharing_mode(plan.sharing).dra_shareable and not base.endswith(SHARED_SUFFIX):
        base += SHARED_SUFFIX
    return f"{base}.{RESOURCE_PREFIX}"


def device_classes(plans: Sequence[ResourcePlan]) -> list[Json]:
    """Every class this config calls for, in name order."""
    kinds = {p.name: {d.kind for d in p.devices} for p in plans}
    default = next((p for p in plans if p.name == DEFAULT_GPU_RESOURCE), None)
    unshared_default = default is not None and not sharing_mode(default.sharing).shares_devices
    gpu_extended = (
        DEFAULT_GPU_RESOURCE if unshared_default and kinds[DEFAULT_GPU_RESOURCE] != {"mig"} else None
    )
    mig_extended = (
        DEFAULT_GPU_RESOURCE if unshared_default and kinds[DEFAULT_GPU_RESOURCE] == {"mig"} else None
    )
    classes = {
        DRIVER_NAME: _device_class(DRIVER_NAME, _selector(f'{_ATTR}.type == "gpu"', _UNSHARED), gpu_extended),
        MIG_CLASS: _device_class(MIG_CLASS, _selector(f'{_ATTR}.type == "mig"', _UNSHARED), mig_extended),
    }
    for plan in plans:
        if not sharing_mode(plan.sharing).dra_class or (
            plan.name == DEFAULT_GPU_RESOURCE and unshared_default
        ):
            continue
        name = class_name(plan)
        classes.setdefault(
            name, _device_class(name, _selector(f'{_ATTR}.resourceName == "{plan.name}"'), plan.name)
        )
    return [classes[name] for name in sorted(classes)]

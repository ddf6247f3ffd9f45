"""Resource naming in the config, off by default as in NVIDIA v0.20 (its `DisableResourceNamingInConfig`).

NVIDIA's plugin (v0.20, api/config/v1/config.go and replicas.go) loads the `resources` section and the
`rename` and `devices` fields of `sharing.timeSlicing.resources` / `sharing.mps.resources`, then drops them
at start with one warning each:

- `resources.gpus` / `resources.mig`: every pattern is dropped, so GPUs and MIG devices keep their default
  names (`nvidia.com/gpu`, `nvidia.com/mig-<profile>`);
- `rename`: each entry is advertised as `<name>.shared` under `renameByDefault: true`, else as `<name>`;
- `devices`: each entry shares all the devices of its resource.

A v0.20 ConfigMap holding any of these therefore advertises the default names and counts there; this plugin
does the same by default (`drop_resource_naming`, with NVIDIA's warning texts), so swapping the image
changes nothing a pod asks for. `flags.resourceNaming: true` (`--resource-naming`, NVDP_RESOURCE_NAMING)
applies them instead, as NVIDIA's resource manager would (resource_plans.py).
"""

from __future__ import annotations

from dataclasses import replace

from nvidia_device_plugin.config.document import Invalid
from nvidia_device_plugin.config.schema import KeyNotes
from nvidia_device_plugin.config.v1 import (
    SHARED_SUFFIX,
    InvalidValue,
    ReplicatedDevices,
    ReplicatedResource,
    ReplicatedResources,
    Resources,
    Sharing,
)

# NVIDIA v0.20's warnings, word for word (klog.Warning in DisableResourceNamingInConfig).
RESOURCES_IGNORED = "Customizing the 'resources' field is not yet supported in the config. Ignoring..."
RENAME_IGNORED = (
    "Setting the 'rename' field in sharing.{section}.resources is not yet supported in the config. "
    "Ignoring..."
)
DEVICES_IGNORED = (
    "Customizing the 'devices' field in sharing.{section}.resources is not yet supported in the config. "
    "Ignoring..."
)
OPT_IN = (
    "NVIDIA v0.20 ignores it too; to apply it, set flags.resourceNaming: true (--resource-naming, "
    "NVDP_RESOURCE_NAMING=true)"
)


def drop_resource_naming(
    resources: Resources, sharing: Sharing, notes: KeyNotes
) -> tuple[Resources, Sharing]:
    """`resources` and `sharing` as NVIDIA v0.20 serves them: without renames and device selections.

    Each kind of setting dropped is one warning in `notes` (kind "ignored"), naming the fields it drops and
    quoting NVIDIA's warning, as NVIDIA logs one per kind.
    """
    if resources.gpus or resources.mig:
        fields = [f"resources.{key}" for key in ("gpus", "mig") if getattr(resources, key)]
        notes.warn("ignored", fields[0], f"{', '.join(fields)}: {RESOURCES_IGNORED} ({OPT_IN})")
    time_slicing = _drop_from(sharing.time_slicing, "timeSlicing", notes)
    mps = _drop_from(sharing.mps, "mps", notes) if sharing.mps is not None else None
    return Resources(), Sharing(time_slicing=time_slicing, mps=mps)


def _drop_from(shared: ReplicatedResources, section: str, notes: KeyNotes) -> ReplicatedResources:
    renamed: list[str] = []
    selected: list[str] = []
    entries: list[ReplicatedResource] = []
    for i, entry in enumerate(shared.resources):
        path = f"sharing.{section}.resources[{i}]"
        default_name = entry.name + SHARED_SUFFIX if shared.rename_by_default else None
        if entry.rename != default_name:
            renamed.append(f"{path}.rename")
        if not _all_devices(entry.devices):
            selected.append(f"{path}.devices")
        entries.append(replace(entry, rename=default_name, devices=ReplicatedDevices()))
    if renamed:
        notes.warn(
            "ignored",
            renamed[0],
            f"{', '.join(renamed)}: {RENAME_IGNORED.format(section=section)} ({OPT_IN})",
        )
    if selected:
        notes.warn(
            "ignored",
            selected[0],
            f"{', '.join(selected)}: {DEVICES_IGNORED.format(section=section)} ({OPT_IN})",
        )
    try:
        return replace(shared, resources=tuple(entries))
    except InvalidValue as exc:  # two entries that now land on one name with two replica counts
        path, text = exc.located(f"sharing.{section}")
        raise Invalid(path, text) from None


def _all_devices(devices: ReplicatedDevices) -> bool:
    return devices.all and devices.count is None and not devices.refs

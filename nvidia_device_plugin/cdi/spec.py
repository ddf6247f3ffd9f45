"""CDI spec documents from a snapshot's plans and a scan of the node (`generate_specs` is pure).

The `gpu` class defines one device per physical device Allocate can name, under the name Allocate uses
(`runtime_device_id`: the GPU or MIG UUID, or "3" / "3:1" with `deviceIDStrategy: index`); MIG devices
are in the `gpu` class too, and there is no device "all", as in NVIDIA's plugin spec. Each device's edits
carry its device nodes (a GPU's DRM nodes too) and a create-symlinks hook for its /dev/dri/by-path links.
The spec's common edits carry the control nodes, the driver's files as read-only mounts (edits.py), and
NVIDIA's hooks, run through `nvidiaCTKPath`. With IMEX channels configured and present, class
`imex-channel` defines one device per channel ("0"). `gdrcopyEnabled` / `gdsEnabled` / `mofedEnabled`
add one spec each (class `gdrcopy`, `gds`, `mofed`) with the device "all", which Allocate names after the
GPUs and IMEX channels; where the mode's kernel nodes are absent its spec would be empty, so it is left
out (with a note) and not named, as NVIDIA drops an empty spec and still serves the GPUs. Each document
declares the lowest cdiVersion its features need (version.py). A WSL2 node (/dev/dxg) gets the `gpu`
spec of wsl.py and no other.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nvidia_device_plugin.cdi.edits import common_edits, device_edits, node_edit, settings_notes
from nvidia_device_plugin.cdi.model import (
    CDI_VENDOR,
    GPU_CLASS,
    IMEX_CLASS,
    CdiError,
    CdiPlan,
    CdiSettings,
    CdiSpec,
    Mount,
    cdi_kind,
    extra_mode,
    runtime_device_id,
)
from nvidia_device_plugin.cdi.scan import NodeScan, scan_node
from nvidia_device_plugin.cdi.version import minimum_version
from nvidia_device_plugin.cdi.wsl import wsl_common_edits, wsl_device_edits
from nvidia_device_plugin.config.v1 import Config, any_cdi_enabled
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.devnodes import is_wsl, under
from nvidia_device_plugin.nvml.host import HostPaths
from nvidia_device_plugin.plans.resources import ResourcePlan


def plan_cdi(
    inventory: Inventory, plans: Sequence[ResourcePlan], config: Config, host: HostPaths
) -> CdiPlan | None:
    """The specs the snapshot needs under a CDI strategy (None without one); scans the node.

    The driver root is read where this process sees it: the session's (a simulated node's fake one) or
    else `containerDriverRoot`; the spec directory is `cdiSpecDir` under the session's spec root. A
    problem found is returned in the plan, not raised: the snapshot is still valid for everything but the
    CDI resources.
    """
    if not any_cdi_enabled(config.flags.plugin.device_list_strategy):
        return None
    settings = CdiSettings.from_config(config)
    spec_dir = str(host.spec_root / settings.spec_dir.lstrip("/"))
    notes = settings_notes(settings)
    driver_root = host.driver_root if host.driver_root is not None else Path(settings.container_driver_root)
    if is_wsl(str(host.dev_root)):
        return _plan_wsl(plans, settings, driver_root, spec_dir, notes + _dropped_notes(settings, host))
    devices = [d for plan in plans for d in plan.devices]
    channels = config.imex.channel_ids
    try:
        scan = scan_node(inventory, devices, driver_root, host, settings.extra_modes, channels)
        specs = generate_specs(plans, settings, scan)
    except CdiError as exc:
        return CdiPlan(spec_dir, problem=f"cannot generate the CDI spec: {exc}", notes=notes)
    dropped = [m for m in settings.extra_modes if not scan.extra_mode_nodes[m]]
    return CdiPlan(
        spec_dir,
        specs=specs,
        notes=notes + tuple(_dropped_note(mode, host.dev_root) for mode in dropped),
        imex_channels=tuple(scan.imex_channels),
        extra_modes=tuple(m for m in settings.extra_modes if m not in dropped),
    )


def _plan_wsl(
    plans: Sequence[ResourcePlan],
    settings: CdiSettings,
    driver_root: Path,
    spec_dir: str,
    notes: tuple[str, ...],
) -> CdiPlan:
    """A WSL2 node's plan: the `gpu` spec of wsl.py, each device Allocate names holding /dev/dxg."""
    ids = (runtime_device_id(d, settings.device_id_strategy) for plan in plans for d in plan.devices)
    devices = [{"name": name, "containerEdits": wsl_device_edits(settings)} for name in dict.fromkeys(ids)]
    try:
        common = wsl_common_edits(driver_root, settings)
    except CdiError as exc:
        return CdiPlan(spec_dir, problem=f"cannot generate the CDI spec: {exc}", notes=notes)
    return CdiPlan(spec_dir, specs=(make_spec(GPU_CLASS, devices, common),) if devices else (), notes=notes)


def _dropped_notes(settings: CdiSettings, host: HostPaths) -> tuple[str, ...]:
    """On WSL2 the extra modes' kernel nodes do not exist: each is left out, as where they are missing."""
    return tuple(_dropped_note(mode, host.dev_root) for mode in settings.extra_modes)


def _dropped_note(mode: str, dev_root: Path) -> str:
    wanted = ", ".join(f"/dev/{p}" for p in extra_mode(mode).device_node_globs)
    return (
        f"{mode}Enabled is true but no {wanted} exists under {dev_root}: the {mode} spec would be empty, "
        f"so it is left out and containers get no {mode} devices (as NVIDIA's plugin does); load the "
        f"{mode} kernel module, or set {mode}Enabled to false"
    )


def generate_specs(
    plans: Sequence[ResourcePlan], settings: CdiSettings, scan: NodeScan
) -> tuple[CdiSpec, ...]:
    """The `gpu` spec, the `imex-channel` spec and one per extra mode with nodes; pure (every fact about
    the node comes from `scan`)."""
    entries: dict[str, dict[str, Any]] = {}
    for plan in plans:
        for dev in plan.devices:
            name = runtime_device_id(dev, settings.device_id_strategy)
            if name not in entries:
                uuid = dev.physical_uuid
                edits = device_edits(scan.device_nodes[uuid], scan.device_links[uuid], settings)
                entries[name] = {"name": name, "containerEdits": edits}
    specs = []
    if entries:
        specs.append(make_spec(GPU_CLASS, list(entries.values()), common_edits(settings, scan)))
    if scan.imex_channels:
        channels = [
            {"name": str(channel), "containerEdits": {"deviceNodes": [node_edit(path, settings)]}}
            for channel, path in scan.imex_channels.items()
        ]
        specs.append(make_spec(IMEX_CLASS, channels, None))
    for mode in settings.extra_modes:
        if scan.extra_mode_nodes[mode]:
            specs.append(make_spec(mode, [_extra_device(mode, scan, settings)], None))
    return tuple(specs)


def _extra_device(mode: str, scan: NodeScan, settings: CdiSettings) -> dict[str, Any]:
    edits: dict[str, Any] = {"deviceNodes": [node_edit(p, settings) for p in scan.extra_mode_nodes[mode]]}
    mounts = [Mount(path, path) for path in scan.extra_mode_mounts.get(mode, ())]
    if mounts:
        edits["mounts"] = [
            {
                "hostPath": under(settings.nvidia_driver_root, m.path),
                "containerPath": m.container_path,
                "options": list(m.options),
            }
            for m in mounts
        ]
    return {"name": "all", "containerEdits": edits}


def make_spec(cdi_class: str, devices: list[dict[str, Any]], common: dict[str, Any] | None) -> CdiSpec:
    """The spec of class `cdi_class` defining `devices`, at the lowest cdiVersion its fields allow."""
    kind = cdi_kind(cdi_class)
    document: dict[str, Any] = {"cdiVersion": "", "kind": kind, "devices": devices}
    if common:
        document["containerEdits"] = common
    document["cdiVersion"] = minimum_version(document)
    return CdiSpec(file_name=f"{CDI_VENDOR}-{cdi_class}.json", kind=kind, document=document)

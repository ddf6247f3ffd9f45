"""CDI spec documents from a snapshot's plans and a scan of the node (`generate_specs` is pure).

The `gpu` class defines one device per physical device Allocate can name, under the name Allocate uses
(`runtime_device_id`: the GPU or MIG UUID, or "3" / "3:1" with `deviceIDStrategy: index`), and "all". MIG
devices are in the `gpu` class too, as in NVIDIA's plugin, since Allocate names them `gpu=<id>`. Each
device's edits carry its device nodes; the spec's common edits carry the control nodes, the driver's
libraries, binaries and firmware as read-only bind mounts, and NVIDIA's hooks (create-symlinks,
update-ldcache) run through `nvidiaCTKPath`. `gdrcopyEnabled` / `gdsEnabled` / `mofedEnabled` add one spec
each (class `gdrcopy`, `gds`, `mofed`) with the device "all", which Allocate names after the GPUs.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nvidia_device_plugin.cdi.model import (
    CDI_VENDOR,
    CDI_VERSION,
    GPU_CLASS,
    CdiError,
    CdiPlan,
    CdiSettings,
    CdiSpec,
    cdi_kind,
    runtime_device_id,
)
from nvidia_device_plugin.cdi.scan import NodeScan, scan_node
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.devnodes import under
from nvidia_device_plugin.nvml.host import HostPaths
from nvidia_device_plugin.resources import ResourcePlan

# Hooks these specs can carry; cdiDisableHooks names them (or "all"). NVIDIA's toolkit knows a few more,
# which these specs never carry, so disabling them is accepted and changes nothing.
GENERATED_HOOKS = ("create-symlinks", "update-ldcache")
OTHER_KNOWN_HOOKS = ("enable-cuda-compat", "disable-device-node-modification", "chmod")
# cdiFeatureFlags with an effect here; others are accepted with a note.
FEATURE_PERSISTENCED_SOCKET = "include-persistenced-socket"
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")
# Tells the legacy nvidia-container-runtime hook not to inject devices a second time.
VISIBLE_DEVICES_VOID = "NVIDIA_VISIBLE_DEVICES=void"


def plan_cdi(
    inventory: Inventory, plans: Sequence[ResourcePlan], config: Config, host: HostPaths
) -> CdiPlan | None:
    """The specs the snapshot needs under a CDI strategy (None without one); scans the node.

    The driver root is read where this process sees it: the session's (a simulated node's fake one) or
    else `containerDriverRoot`; the spec directory is `cdiSpecDir` under the session's spec root. A
    problem found is returned in the plan, not raised: the snapshot is still valid for everything but the
    CDI resources.
    """
    if not config.flags.plugin.cdi_enabled:
        return None
    settings = CdiSettings.from_config(config)
    spec_dir = str(host.spec_root / settings.spec_dir.lstrip("/"))
    notes = settings_notes(settings)
    driver_root = host.driver_root if host.driver_root is not None else Path(settings.container_driver_root)
    devices = [d for plan in plans for d in plan.devices]
    try:
        scan = scan_node(inventory, devices, driver_root, host.dev_root, host.proc_root, settings.extra_modes)
        specs = generate_specs(plans, settings, scan)
    except CdiError as exc:
        return CdiPlan(spec_dir, problem=f"cannot generate the CDI spec: {exc}", notes=notes)
    return CdiPlan(spec_dir, specs=specs, notes=notes)


def settings_notes(settings: CdiSettings) -> tuple[str, ...]:
    notes = []
    known = {"all", *GENERATED_HOOKS, *OTHER_KNOWN_HOOKS}
    for hook in settings.disabled_hooks:
        if hook not in known:
            notes.append(
                f"cdiDisableHooks: unknown hook {hook!r} ignored (known: {', '.join(sorted(known))})"
            )
    for flag in settings.feature_flags:
        if flag != FEATURE_PERSISTENCED_SOCKET:
            notes.append(
                f"cdiFeatureFlags: {flag!r} has no effect on this plugin's specs (supported: "
                f"{FEATURE_PERSISTENCED_SOCKET})"
            )
    return tuple(notes)


def generate_specs(
    plans: Sequence[ResourcePlan], settings: CdiSettings, scan: NodeScan
) -> tuple[CdiSpec, ...]:
    """The `gpu` spec and one spec per extra mode; pure (every fact about the node comes from `scan`)."""
    devices: dict[str, list[str]] = {}
    for plan in plans:
        for dev in plan.devices:
            name = runtime_device_id(dev, settings.device_id_strategy)
            if name not in devices:
                devices[name] = list(scan.device_nodes[dev.physical_uuid])
    everything = list(dict.fromkeys(node for nodes in devices.values() for node in nodes))
    entries = [_device(name, nodes, settings) for name, nodes in devices.items()]
    if entries:
        entries.append(_device("all", everything, settings))
    specs = []
    if entries:
        specs.append(_spec(GPU_CLASS, entries, _common_edits(settings, scan)))
    for mode in settings.extra_modes:
        specs.append(_spec(mode, [_device("all", list(scan.extra_mode_nodes[mode]), settings)], None))
    return tuple(specs)


def _spec(cdi_class: str, devices: list[dict[str, Any]], common: dict[str, Any] | None) -> CdiSpec:
    kind = cdi_kind(cdi_class)
    document: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": kind, "devices": devices}
    if common:
        document["containerEdits"] = common
    return CdiSpec(file_name=f"{CDI_VENDOR}-{cdi_class}.json", kind=kind, document=document)


def _device(name: str, nodes: list[str], settings: CdiSettings) -> dict[str, Any]:
    return {"name": name, "containerEdits": {"deviceNodes": [_node(p, settings) for p in nodes]}}


def _node(path: str, settings: CdiSettings) -> dict[str, Any]:
    return {"path": path, "hostPath": under(settings.nvidia_dev_root, path)}


def _common_edits(settings: CdiSettings, scan: NodeScan) -> dict[str, Any]:
    driver = scan.driver
    files = [*driver.libraries, *driver.binaries, *driver.firmware]
    if FEATURE_PERSISTENCED_SOCKET in settings.feature_flags and driver.persistenced_socket:
        files.append(driver.persistenced_socket)
    edits: dict[str, Any] = {
        "env": [VISIBLE_DEVICES_VOID],
        "deviceNodes": [_node(p, settings) for p in scan.control_nodes],
        "mounts": [
            {
                "hostPath": under(settings.nvidia_driver_root, path),
                "containerPath": path,
                "options": list(MOUNT_OPTIONS),
            }
            for path in files
        ],
    }
    hooks = _hooks(settings, scan)
    if hooks:
        edits["hooks"] = hooks
    return edits


def _hooks(settings: CdiSettings, scan: NodeScan) -> list[dict[str, Any]]:
    disabled = set(settings.disabled_hooks)
    if "all" in disabled:
        return []
    driver = scan.driver
    hooks = []
    cuda = next((lib for lib in driver.libraries if posixpath.basename(lib).startswith("libcuda.so.")), None)
    if "create-symlinks" not in disabled and cuda is not None:
        link = posixpath.join(posixpath.dirname(cuda), "libcuda.so")
        hooks.append(_hook(settings, "create-symlinks", "--link", f"libcuda.so.1::{link}"))
    if "update-ldcache" not in disabled and driver.library_dirs:
        folders = [arg for folder in driver.library_dirs for arg in ("--folder", folder)]
        hooks.append(_hook(settings, "update-ldcache", *folders))
    return hooks


def _hook(settings: CdiSettings, name: str, *args: str) -> dict[str, Any]:
    program = posixpath.basename(settings.hook_path)
    # nvidia-ctk runs hooks as `nvidia-ctk hook <name>`; the standalone nvidia-cdi-hook as `<name>`.
    prefix = [program, "hook"] if program == "nvidia-ctk" else [program]
    return {"hookName": "createContainer", "path": settings.hook_path, "args": [*prefix, name, *args]}

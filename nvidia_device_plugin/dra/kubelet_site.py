"""The one place the daemon makes the kubelet DRA plugin (dra/kubelet/plugin.py) and feeds it the node.

The plugin reads the node through `current` (the DRA mode's last view: devices by name, the snapshot, the
session's host paths), never blocking; the handover (dra/mode.py) reads `prepared` so that a GPU with a
prepared claim does not go back to the device plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvidia_device_plugin.base.workers import Worker
from nvidia_device_plugin.dra.names import DRIVER_NAME, DraDevice
from nvidia_device_plugin.nvml.host import HostPaths
from nvidia_device_plugin.snapshot import Snapshot

CurrentNode = Callable[[], "tuple[dict[str, DraDevice], Snapshot, HostPaths] | None"]


@dataclass(frozen=True)
class KubeletPluginSite:
    worker: Worker  # started and stopped with the daemon's workers
    prepared: Callable[[], set[str]]  # DRA device names of the claims prepared on this node now
    health: Callable[[], str | None]  # None while it serves kubelet; else why not (for /readyz)


def build_kubelet_plugin(
    plugins_dir: Path, registry_dir: Path, cdi_spec_dir: Path, api_client: Any, current: CurrentNode
) -> KubeletPluginSite:
    """The kubelet DRA plugin for this daemon: registration in `registry_dir`, its endpoint under
    `plugins_dir`, claims read through `api_client`, per-claim CDI specs in `cdi_spec_dir`."""
    from nvidia_device_plugin.cdi.model import CdiSettings
    from nvidia_device_plugin.dra.kubelet.claims import ApiClaimSource
    from nvidia_device_plugin.dra.kubelet.model import NodeDevices
    from nvidia_device_plugin.dra.kubelet.plugin import DraKubeletPlugin

    def node() -> NodeDevices | None:
        view = current()
        if view is None:
            return None
        devices, snapshot, host = view
        return NodeDevices(devices, snapshot.inventory, host, CdiSettings.from_config(snapshot.config))

    plugin = DraKubeletPlugin(
        plugins_dir=plugins_dir,
        registry_dir=registry_dir,
        claims=ApiClaimSource(api_client),
        node=node,
        cdi_spec_dir=cdi_spec_dir,
        checkpoint_path=plugins_dir / DRIVER_NAME / "checkpoint.json",
    )
    return KubeletPluginSite(
        plugin, lambda: {d for names in plugin.prepared().values() for d in names}, plugin.health
    )

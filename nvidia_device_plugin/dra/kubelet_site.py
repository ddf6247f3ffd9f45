"""THE call site of the kubelet DRA plugin (dra/kubelet/, built beside this branch): the one place the
daemon makes it. Until dra/kubelet/ is merged there is nothing to make, and the DRA mode publishes
ResourceSlices without preparing claims (logged at start).

To connect at merge, replace the body of `build_kubelet_plugin` with (the plugin's documented
constructor, dra/kubelet/plugin.py):

    from nvidia_device_plugin.cdi.<settings module> import CdiSettings        # as dra/kubelet/model.py says
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
    return KubeletPluginSite(plugin, lambda: {d for names in plugin.prepared().values() for d in names})

The handover (dra/mode.py) reads `prepared` so that a GPU with a prepared claim does not go back to the
device plugin.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvidia_device_plugin.dra.names import DraDevice
from nvidia_device_plugin.nvml.host import HostPaths
from nvidia_device_plugin.snapshot import Snapshot
from nvidia_device_plugin.workers import Worker

log = logging.getLogger(__name__)

CurrentNode = Callable[[], "tuple[dict[str, DraDevice], Snapshot, HostPaths] | None"]


@dataclass(frozen=True)
class KubeletPluginSite:
    worker: Worker  # started and stopped with the daemon's workers
    prepared: Callable[[], set[str]]  # DRA device names of the claims prepared on this node now


def build_kubelet_plugin(
    plugins_dir: Path, registry_dir: Path, cdi_spec_dir: Path, api_client: Any, current: CurrentNode
) -> KubeletPluginSite | None:
    """The kubelet DRA plugin for this daemon, or None where this build has none (see the module doc)."""
    log.warning(
        "DRA: this build has no kubelet DRA plugin yet (dra/kubelet/); ResourceSlices are published, "
        "claims are not prepared (plugins dir %s, registry %s)",
        plugins_dir,
        registry_dir,
    )
    return None

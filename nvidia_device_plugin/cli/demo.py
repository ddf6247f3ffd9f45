"""`nvidia-device-plugin demo`: the daemon against an in-process kubelet stand-in on a simulated node."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.daemon import Daemon, DaemonOptions
from nvidia_device_plugin.nvml.session import NvmlSession
from nvidia_device_plugin.plugin.kubelet_standin import KubeletStandIn


def run_demo(
    node: str,
    open_nvml: Callable[[], NvmlSession],
    load_config: Callable[[], Config],
    out: TextIO,
    pod_devices: int = 2,
) -> int:
    # /tmp, not a deep temp dir: unix socket paths must stay under ~108 bytes.
    plugin_dir = Path(tempfile.mkdtemp(prefix="nvdp-demo-", dir="/tmp"))
    daemon: Daemon | None = None
    try:
        with KubeletStandIn(plugin_dir) as kubelet:
            daemon = Daemon(
                DaemonOptions(plugin_dir=plugin_dir, load_config=load_config, open_nvml=open_nvml)
            )
            daemon.start()
            assert daemon.snapshot is not None
            names = [p.name for p in daemon.snapshot.plans]
            if not kubelet.wait_for_resources(names, timeout=10):
                out.write(f"demo: resources not registered with the kubelet stand-in: {names}\n")
                return 1
            out.write(f"Simulated node '{node}': {len(daemon.snapshot.inventory.gpus)} GPUs\n")
            out.write(f"Kubelet stand-in in {plugin_dir}\n\n")
            labels = {
                d.id: f"GPU {d.index_id}" + (f" replica {d.replica}" if d.replica is not None else "")
                for plan in daemon.snapshot.plans
                for d in plan.devices
            }
            for plan in daemon.snapshot.plans:
                devices = kubelet.devices(plan.name)
                out.write(f"{plan.name}: {len(devices)} devices advertised over ListAndWatch\n")
                shown = [d.id for d in plan.devices if d.id in devices]
                for device_id in shown[:16]:
                    device = devices[device_id]
                    numa = ",".join(str(n.ID) for n in device.topology.nodes) or "-"
                    out.write(f"  {device_id:<58} {labels[device_id]:<18} {device.health:<9} numa={numa}\n")
                if len(shown) > 16:
                    out.write(f"  ... and {len(shown) - 16} more\n")
            resource = names[0]
            count = min(pod_devices, len(kubelet.devices(resource)))
            chosen, response = kubelet.admit(resource, count)
            out.write(f"\nAdmitted a pod asking for {resource}: {count}\n")
            out.write(f"  preferred allocation: {', '.join(labels[c] for c in chosen)}\n")
            for key, value in sorted(response.envs.items()):
                out.write(f"  env {key}={value}\n")
            for mount in response.mounts:
                out.write(f"  mount {mount.host_path} -> {mount.container_path}\n")
            for spec in response.devices:
                out.write(f"  device {spec.host_path} -> {spec.container_path} ({spec.permissions})\n")
            for key, value in sorted(response.annotations.items()):
                out.write(f"  annotation {key}={value}\n")
            for cdi in response.cdi_devices:
                out.write(f"  cdi device {cdi.name}\n")
            return 0
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)

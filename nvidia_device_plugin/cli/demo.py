"""`nvidia-device-plugin demo`: the daemon against an in-process kubelet stand-in on a simulated node."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from nvidia_device_plugin.cli.common import AddParser, add_common_arguments, config_loader

if TYPE_CHECKING:
    from nvidia_device_plugin.config.v1 import Config
    from nvidia_device_plugin.nvml.session import NvmlSession
    from nvidia_device_plugin.plugin.kubelet_standin import KubeletStandIn
    from nvidia_device_plugin.snapshot import Snapshot

_SHOWN_PER_RESOURCE = 16


def add_parser(commands: AddParser, environ: Mapping[str, str]) -> None:
    demo = commands("demo", help="run the daemon on a simulated node against a kubelet stand-in")
    add_common_arguments(demo, environ, simulate_default="dgx-a100")
    demo.add_argument(
        "--pod-devices", type=int, default=2, help="devices the sample pod asks for (default 2)"
    )
    demo.set_defaults(handler=demo_command)


def demo_command(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from nvidia_device_plugin.cli.session import nvml_opener

    open_session, _simulator = nvml_opener(args.simulate)
    load_config = config_loader(args, environ)
    return run_demo(args.simulate, open_session, load_config, sys.stdout, pod_devices=args.pod_devices)


def run_demo(
    node: str,
    open_nvml: Callable[[], NvmlSession],
    load_config: Callable[[], Config],
    out: TextIO,
    pod_devices: int = 2,
) -> int:
    from nvidia_device_plugin.daemon import Daemon, DaemonOptions
    from nvidia_device_plugin.plugin.kubelet_standin import KubeletStandIn

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
            labels = _device_labels(daemon.snapshot)
            _write_advertised(daemon.snapshot, kubelet, labels, out)
            _write_admission(names[0], pod_devices, kubelet, labels, out)
            return 0
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


def _device_labels(snapshot: Snapshot) -> dict[str, str]:
    """Device ID -> "GPU 0", "GPU 0 replica 1", "GPU 0:1 replica 2" for the lines below."""
    return {
        d.id: f"GPU {d.index_id}" + (f" replica {d.replica}" if d.replica is not None else "")
        for plan in snapshot.plans
        for d in plan.devices
    }


def _write_advertised(
    snapshot: Snapshot, kubelet: KubeletStandIn, labels: Mapping[str, str], out: TextIO
) -> None:
    """What kubelet received over ListAndWatch, per resource, the first devices of each in plan order."""
    for plan in snapshot.plans:
        devices = kubelet.devices(plan.name)
        out.write(f"{plan.name}: {len(devices)} devices advertised over ListAndWatch\n")
        shown = [d.id for d in plan.devices if d.id in devices]
        for device_id in shown[:_SHOWN_PER_RESOURCE]:
            device = devices[device_id]
            numa = ",".join(str(n.ID) for n in device.topology.nodes) or "-"
            out.write(f"  {device_id:<58} {labels[device_id]:<18} {device.health:<9} numa={numa}\n")
        if len(shown) > _SHOWN_PER_RESOURCE:
            out.write(f"  ... and {len(shown) - _SHOWN_PER_RESOURCE} more\n")


def _write_admission(
    resource: str, pod_devices: int, kubelet: KubeletStandIn, labels: Mapping[str, str], out: TextIO
) -> None:
    """Admit one pod the way kubelet does (GetPreferredAllocation, then Allocate) and show the answer."""
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

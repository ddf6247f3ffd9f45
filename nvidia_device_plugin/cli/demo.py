"""`nvidia-device-plugin demo`: the daemon against an in-process kubelet stand-in on a simulated node.

It starts the real daemon, as `run` would, with a kubelet stand-in on a temporary device-plugin directory,
shows what kubelet received over ListAndWatch and admits one sample pod (GetPreferredAllocation, then
Allocate). What the config needs runs too: with `sharing.mps`, `mps-control-daemon`'s supervisor in this
process, with a stand-in control program (demo_mps.py), under a temporary MPS root (the config's `mpsRoot`
is moved there, so the demo writes nothing outside its temporary tree).

Every node and config ends with a clear result: the devices and the admitted pod; or, when the node
advertises nothing, why; or, when the sample pod cannot be admitted (more devices than the node has, more
than one replica under failRequestsGreaterThanOne), what kubelet or Allocate says. Exit status 0 when the
demo ran and the sample pod (if any resource is advertised) was admitted, else 1.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from nvidia_device_plugin.cli.common import AddParser, add_common_arguments, config_loader
from nvidia_device_plugin.config.sharing_modes import sharing_mode

if TYPE_CHECKING:
    from nvidia_device_plugin.config.v1 import Config
    from nvidia_device_plugin.daemons.mps_control import MpsControlDaemon
    from nvidia_device_plugin.nvml.session import NvmlSession
    from nvidia_device_plugin.plans.resources import ResourcePlan
    from nvidia_device_plugin.snapshot import Snapshot
    from nvidia_device_plugin.standins.kubelet import KubeletStandIn

_SHOWN_PER_RESOURCE = 16
_DEFAULT_POD_DEVICES = 2
# The demo polls fast: MPS readiness shows within a fraction of a second, not the daemons' production pace.
_MPS_INTERVAL_S = 0.05
_WAIT_S = 15.0


@dataclass(frozen=True)
class DemoNode:
    """How the demo opens the simulated node: one session for the plugin, one for the MPS supervisor."""

    name: str
    open_nvml: Callable[[], NvmlSession]
    open_mps_nvml: Callable[[], NvmlSession] | None = None


def add_parser(commands: AddParser, environ: Mapping[str, str]) -> None:
    demo = commands("demo", help="run the daemon on a simulated node against a kubelet stand-in")
    add_common_arguments(demo, environ, simulate_default="dgx-a100")
    demo.add_argument(
        "--pod-devices",
        type=int,
        default=None,
        metavar="N",
        help=f"devices the sample pod asks for (default: {_DEFAULT_POD_DEVICES}, or 1 where the resource "
        "admits one per container)",
    )
    demo.set_defaults(handler=demo_command)


def demo_command(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from nvidia_device_plugin.cli.session import nvml_opener, open_session

    open_nvml, _simulator = nvml_opener(args.simulate)
    node = DemoNode(args.simulate, open_nvml, lambda: open_session(args.simulate))
    return run_demo(node, config_loader(args, environ), sys.stdout, pod_devices=args.pod_devices)


def run_demo(
    node: DemoNode, load_config: Callable[[], Config], out: TextIO, pod_devices: int | None = None
) -> int:
    """The demo on `node` under the config `load_config` reads; raises DevicePluginError when the daemon
    refuses to start (the config, or NVML), as `run` would."""
    from nvidia_device_plugin.cli.demo_mps import stop_servers
    from nvidia_device_plugin.daemons.run import Daemon, DaemonOptions
    from nvidia_device_plugin.standins.kubelet import KubeletStandIn

    # /tmp, not a deep temp dir: unix socket paths must stay under ~108 bytes.
    root = Path(tempfile.mkdtemp(prefix="nvdp-demo-", dir="/tmp"))
    plugin_dir, mps_root = root / "kubelet", root / "mps"
    plugin_dir.mkdir()

    def demo_config() -> Config:  # the config's MPS root moved into the demo's tree
        config = load_config()
        return replace(config, flags=replace(config.flags, mps_root=str(mps_root)))

    daemon: Daemon | None = None
    mps: MpsControlDaemon | None = None
    try:
        with KubeletStandIn(plugin_dir) as kubelet:
            try:
                # As on a node, the MPS control daemons come first; the plugin then finds them ready.
                if (
                    sharing_mode(demo_config().sharing.strategy).needs_control_daemon
                    and node.open_mps_nvml is not None
                ):
                    mps = _start_mps(demo_config, node.open_mps_nvml, root)
                options = DaemonOptions(
                    plugin_dir, demo_config, node.open_nvml, mps_poll_interval_s=_MPS_INTERVAL_S
                )
                daemon = Daemon(options)
                daemon.start()
                snapshot = daemon.snapshot
                assert snapshot is not None  # start() raises when it cannot serve
                return _show(node.name, snapshot, kubelet, plugin_dir, out, pod_devices)
            finally:  # while the kubelet stand-in still runs: the plugin's stop ends its streams, not kubelet
                if daemon is not None:
                    daemon.stop()
                if mps is not None:
                    mps.stop()
    finally:
        stop_servers(mps_root)
        shutil.rmtree(root, ignore_errors=True)


def _start_mps(
    load_config: Callable[[], Config], open_nvml: Callable[[], NvmlSession], root: Path
) -> MpsControlDaemon:
    from nvidia_device_plugin.cli.demo_mps import stand_in_control
    from nvidia_device_plugin.daemons.mps_control import ControlDaemonOptions, MpsControlDaemon

    control = stand_in_control(root)
    mps = MpsControlDaemon(
        ControlDaemonOptions(load_config, open_nvml, control_path=control, check_interval_s=_MPS_INTERVAL_S)
    )
    mps.start()
    ready = threading.Event()  # never set: a bounded pause between looks
    deadline = time.monotonic() + _WAIT_S
    while not all(s is not None and s.ready for s in mps.supervisor.statuses().values()):
        if time.monotonic() > deadline:
            break  # the plugin then says which GPU is not ready, and why
        ready.wait(_MPS_INTERVAL_S)
    return mps


def _show(
    node: str,
    snapshot: Snapshot,
    kubelet: KubeletStandIn,
    plugin_dir: Path,
    out: TextIO,
    pod_devices: int | None,
) -> int:
    from nvidia_device_plugin.daemons.announce import nothing_served_reason

    names = [p.name for p in snapshot.plans]
    if not kubelet.wait_for_resources(names, timeout=_WAIT_S):
        out.write(f"demo: resources not registered with the kubelet stand-in: {names}\n")
        return 1
    out.write(f"Simulated node '{node}': {len(snapshot.inventory.gpus)} GPUs\n")
    out.write(f"Kubelet stand-in in {plugin_dir}\n\n")
    if not snapshot.plans:
        out.write(f"No resources advertised: {nothing_served_reason(snapshot)}.\n")
        return 0
    if not _wait_until_healthy(snapshot.plans, kubelet):
        out.write("demo: the devices did not all turn Healthy at the kubelet stand-in\n")
    labels = _device_labels(snapshot)
    _write_advertised(snapshot, kubelet, labels, out)
    return _write_admission(snapshot.plans[0], pod_devices, kubelet, labels, out)


def _wait_until_healthy(plans: tuple[ResourcePlan, ...], kubelet: KubeletStandIn) -> bool:
    """MPS replicas are advertised Healthy once their control daemon is ready: wait for that."""
    wanted = {p.name: len(p.devices) for p in plans}

    def healthy() -> bool:
        return all(
            sum(1 for d in kubelet.devices(name).values() if d.health == "Healthy") == count
            for name, count in wanted.items()
        )

    return (
        kubelet.wait_for(healthy, timeout=_WAIT_S)
        if any(sharing_mode(p.sharing).needs_control_daemon for p in plans)
        else True
    )


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
    plan: ResourcePlan, asked: int | None, kubelet: KubeletStandIn, labels: Mapping[str, str], out: TextIO
) -> int:
    """Admit one pod the way kubelet does (GetPreferredAllocation, then Allocate) and show the answer, or
    say why the pod is not admitted; 0 when it is."""
    from nvidia_device_plugin.standins.kubelet_devices import AdmissionError

    healthy = sum(1 for d in kubelet.devices(plan.name).values() if d.health == "Healthy")
    per_container = 1 if plan.fail_requests_greater_than_one else healthy
    count = asked if asked is not None else min(_DEFAULT_POD_DEVICES, per_container, healthy)
    asking = f"a pod asking for {plan.name}: {count}"
    if count < 1 or count > healthy:
        out.write(
            f"\nNot admitted: {asking} stays Pending; the node has {healthy} healthy {plan.name} "
            f"(kubelet: Insufficient {plan.name})\n"
        )
        return 1
    try:
        chosen, response = kubelet.admit(plan.name, count)
    except AdmissionError as exc:  # the pod's status, as kubelet words it
        out.write(f"\nNot admitted: {asking}: {exc}\n")
        return 1
    out.write(f"\nAdmitted {asking}\n")
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

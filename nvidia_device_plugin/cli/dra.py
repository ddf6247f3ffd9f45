"""`nvidia-device-plugin dra plan`: write the ResourceSlices and DeviceClasses this node would publish,
one YAML file per object; and the flags `run` takes for the DRA mode (the config's `dra` section turns
it on; these say where things are on the node)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from nvidia_device_plugin.cli.common import AddParser, add_common_arguments, env_value, seconds_up_to

if TYPE_CHECKING:
    from nvidia_device_plugin.dra.options import DraOptions
    from nvidia_device_plugin.snapshot import Snapshot

DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_HANDOVER_INTERVAL_S = 1.0  # as dra.mode.POLL_INTERVAL_S (not imported: `--help` stays light)
DEFAULT_KUBELET_RESTART_GRACE_S = 30.0  # as dra.options.KUBELET_RESTART_GRACE_S


def add_parser(commands: AddParser, environ: Mapping[str, str]) -> None:
    dra = commands("dra", help="DRA (resource.k8s.io/v1): what this node would publish")
    sub = dra.add_subparsers(dest="dra_command", metavar="SUBCOMMAND")

    def usage(_args: argparse.Namespace, _environ: Mapping[str, str]) -> int:
        dra.print_help()
        return 2

    dra.set_defaults(handler=usage, log_level="info", log_format="text")  # `dra` alone: say what it has
    plan = sub.add_parser("plan", help="write the ResourceSlices and DeviceClasses as YAML files")
    add_common_arguments(plan, environ)
    plan.add_argument("--output-dir", required=True, metavar="DIR", help="where to write the YAML files")
    plan.add_argument(
        "--node-name",
        default=env_value(environ, "NODE_NAME", "node"),
        help="the node (and pool) the slices are for [env NODE_NAME]",
    )
    plan.set_defaults(handler=write_dra_plan)


def add_run_arguments(run: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """The node paths of the DRA mode, for `run`."""
    group = run.add_argument_group("DRA mode (turned on by the config's dra.enabled, --dra or NVDP_DRA)")
    group.add_argument(
        "--pod-resources-socket",
        default=env_value(environ, "NVDP_POD_RESOURCES_SOCKET", DEFAULT_POD_RESOURCES_SOCKET),
        metavar="PATH",
        help="kubelet's pod-resources socket, read before a GPU moves between the device plugin and DRA "
        f"(default {DEFAULT_POD_RESOURCES_SOCKET}) [env NVDP_POD_RESOURCES_SOCKET]",
    )
    group.add_argument(
        "--kubelet-plugins-dir",
        default=env_value(environ, "NVDP_KUBELET_PLUGINS_DIR", DEFAULT_PLUGINS_DIR),
        metavar="DIR",
        help=f"kubelet's plugins directory (default {DEFAULT_PLUGINS_DIR}) [env NVDP_KUBELET_PLUGINS_DIR]",
    )
    group.add_argument(
        "--kubelet-registry-dir",
        default=env_value(environ, "NVDP_KUBELET_REGISTRY_DIR", DEFAULT_REGISTRY_DIR),
        metavar="DIR",
        help="kubelet's plugin registration directory "
        f"(default {DEFAULT_REGISTRY_DIR}) [env NVDP_KUBELET_REGISTRY_DIR]",
    )
    group.add_argument(
        "--dra-handover-interval",
        type=seconds_up_to(60),
        default=env_value(environ, "NVDP_DRA_HANDOVER_INTERVAL", str(DEFAULT_HANDOVER_INTERVAL_S)),
        metavar="SECONDS",
        help="while a GPU moves between the device plugin and DRA, how long between two readings of "
        f"pod-resources (a GPU moves after two that find it free; default {DEFAULT_HANDOVER_INTERVAL_S:g}) "
        "[env NVDP_DRA_HANDOVER_INTERVAL]",
    )
    group.add_argument(
        "--dra-kubelet-restart-grace",
        type=seconds_up_to(600),
        default=env_value(environ, "NVDP_DRA_KUBELET_RESTART_GRACE", str(DEFAULT_KUBELET_RESTART_GRACE_S)),
        metavar="SECONDS",
        help="how long kubelet's pod-resources socket must have been up (after kubelet starts, or after a "
        "reading that failed) before the handover believes it: kubelet restores its pods after the socket "
        f"is up (default {DEFAULT_KUBELET_RESTART_GRACE_S:g}) [env NVDP_DRA_KUBELET_RESTART_GRACE]",
    )


def write_dra_plan(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    import yaml

    from nvidia_device_plugin.cli.session import open_session
    from nvidia_device_plugin.config.flags import resolve_config
    from nvidia_device_plugin.dra.dryrun import dry_run
    from nvidia_device_plugin.snapshot import build_snapshot

    config = resolve_config(args, environ)
    session = open_session(args.simulate)
    try:
        plan = dry_run(build_snapshot(session, config), args.node_name)
    finally:
        session.close()
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for obj in [*plan.slices, *plan.classes]:
        path = out / f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(obj, sort_keys=False))
    devices = sum(len(s["spec"].get("devices", [])) for s in plan.slices)
    counter_sets = sum(len(s["spec"].get("sharedCounters", [])) for s in plan.slices)
    gpus = ", ".join(map(str, plan.owned)) or "none"
    print(f"{out}: {len(plan.slices)} ResourceSlice(s) with {devices} device(s) of GPUs {gpus}, ", end="")
    if counter_sets:  # dynamic MIG: one per GPU publishing MIG partitions
        print(f"{counter_sets} counter set(s), ", end="")
    print(f"{len(plan.classes)} DeviceClass(es)")
    if not plan.enabled:
        print("note: dra.enabled is false in this config; a daemon publishes these once it is turned on")
    return 0


def dra_options(args: argparse.Namespace) -> DraOptions:
    """`run`'s DRA options from its flags; the API client is made only once a config turns DRA on."""
    from nvidia_device_plugin.dra.options import DraOptions

    def api_client() -> object:
        from nvidia_device_plugin.configmanager.nodewatch import api_client_from_environment

        return api_client_from_environment()

    return DraOptions(
        node_name=args.node_name or "",
        pod_resources_socket=Path(args.pod_resources_socket),
        kubelet_plugins_dir=Path(args.kubelet_plugins_dir),
        kubelet_registry_dir=Path(args.kubelet_registry_dir),
        api_client=api_client,
        poll_interval_s=args.dra_handover_interval,
        kubelet_restart_grace_s=args.dra_kubelet_restart_grace,
    )


def dra_summary(snapshot: Snapshot) -> str:
    """The line `plan` ends with when DRA is on: which GPUs DRA owns (the table shows them all)."""
    from nvidia_device_plugin.dra.ownership import DRA, wanted_owners

    owners = wanted_owners(snapshot.inventory, snapshot.config.dra)
    owned = sorted(g.index for g in snapshot.inventory.gpus if owners.get(g.uuid) == DRA)
    gpus = ", ".join(map(str, owned)) or "none"
    return (
        f"DRA: on; GPUs {gpus} go to DRA (driver gpu.nvidia.com) once free, the device plugin keeps the "
        "rest; "
        "`nvidia-device-plugin dra plan` writes what DRA publishes"
    )

"""Command line: run (default), mps-control-daemon, demo, plan, check-config, labels.

Precedence: flag > env > config file > default.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from nvidia_device_plugin import __version__
from nvidia_device_plugin.cli.labels import add_labels_command, add_labels_file_arguments, labels_options
from nvidia_device_plugin.cli.mps_control import add_arguments as add_mps_control_arguments
from nvidia_device_plugin.config.flags import add_config_arguments, config_source, load_from, resolve_config
from nvidia_device_plugin.config.loader import gfd_incompatibilities, load_config_file
from nvidia_device_plugin.config.source import ConfigSource
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.config.watch import ConfigWatcher
from nvidia_device_plugin.errors import ConfigError, DevicePluginError
from nvidia_device_plugin.logs import LOG_FORMATS, LOG_LEVELS, configure_logging
from nvidia_device_plugin.signals import serve_until_stopped

if TYPE_CHECKING:
    from nvidia_device_plugin.configmanager.inprocess import NodeLabelConfig
    from nvidia_device_plugin.nvml.session import NvmlSession
    from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml

log = logging.getLogger("nvidia_device_plugin")

COMMANDS = ("run", "mps-control-daemon", "demo", "plan", "check-config", "labels")
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_METRICS_ADDRESS = ":9402"


def _env(environ: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    value = environ.get(name)
    return value if value not in (None, "") else default


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nvidia-device-plugin",
        description="Kubernetes device plugin for NVIDIA GPUs: whole GPUs, time-slicing, MPS and MIG.",
    )
    parser.add_argument("--version", action="version", version=f"nvidia-device-plugin {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def common(sub: argparse.ArgumentParser, simulate_default: str | None) -> None:
        sub.add_argument(
            "--simulate",
            metavar="NODE",
            default=_env(environ, "NVDP_SIMULATE", simulate_default),
            help="use a simulated node (preset name or YAML node file) instead of NVML [env NVDP_SIMULATE]",
        )
        sub.add_argument(
            "--log-level",
            choices=LOG_LEVELS,
            default=_env(environ, "NVDP_LOG_LEVEL", "info"),
            help="[env NVDP_LOG_LEVEL]",
        )
        sub.add_argument(
            "--log-format",
            choices=LOG_FORMATS,
            default=_env(environ, "NVDP_LOG_FORMAT", "text"),
            help="text for people, json for log pipelines [env NVDP_LOG_FORMAT]",
        )
        add_config_arguments(sub)

    run = commands.add_parser("run", help="run the device plugin daemon (the default command)")
    common(run, None)
    run.add_argument(
        "--device-plugin-path",
        default=_env(environ, "DEVICE_PLUGIN_PATH", DEFAULT_PLUGIN_DIR),
        help=f"kubelet's device-plugin directory (default {DEFAULT_PLUGIN_DIR}) [env DEVICE_PLUGIN_PATH]",
    )
    run.add_argument(
        "--kubelet-socket",
        default=_env(environ, "KUBELET_SOCKET", "kubelet.sock"),
        help="kubelet registration socket, relative to --device-plugin-path [env KUBELET_SOCKET]",
    )
    run.add_argument(
        "--node-config-label",
        default=_env(environ, "NVDP_NODE_CONFIG_LABEL", ""),
        metavar="LABEL",
        help="choose the config in --config-dir by this label of the node "
        "(e.g. nvidia.com/device-plugin.config), followed live, with --config-default and "
        "--config-fallback-strategies as NVIDIA's config-manager uses them; needs NODE_NAME and "
        "list/watch on the node [env NVDP_NODE_CONFIG_LABEL]",
    )
    run.add_argument(
        "--node-name",
        default=_env(environ, "NODE_NAME", ""),
        help="this node's name, for --node-config-label [env NODE_NAME]",
    )
    run.add_argument(
        "--simulate-events",
        metavar="FILE",
        default=_env(environ, "NVDP_SIMULATE_EVENTS"),
        help="JSON-lines file of injected health events for --simulate [env NVDP_SIMULATE_EVENTS]",
    )
    run.add_argument(
        "--metrics-address",
        default=_env(environ, "NVDP_METRICS_ADDRESS", DEFAULT_METRICS_ADDRESS),
        help=f"host:port for /metrics, /healthz, /readyz (default {DEFAULT_METRICS_ADDRESS}; empty disables) "
        "[env NVDP_METRICS_ADDRESS]",
    )

    add_labels_file_arguments(run, environ)

    mps_control = commands.add_parser(
        "mps-control-daemon", help="run the MPS control daemons of the GPUs the config shares with MPS"
    )
    common(mps_control, None)
    add_mps_control_arguments(mps_control, environ)

    demo = commands.add_parser("demo", help="run the daemon on a simulated node against a kubelet stand-in")
    common(demo, "dgx-a100")
    demo.add_argument(
        "--pod-devices", type=int, default=2, help="devices the sample pod asks for (default 2)"
    )

    plan = commands.add_parser("plan", help="print the resources and device IDs this node would advertise")
    common(plan, None)
    plan.add_argument("--output", choices=("table", "json"), default="table")
    plan.add_argument(
        "--cdi-spec",
        action="store_true",
        help="print the CDI specs a cdi-annotations / cdi-cri strategy would write, as JSON by file name",
    )

    common(add_labels_command(commands.add_parser), None)

    check = commands.add_parser("check-config", help="validate a config file; non-zero exit with the error")
    check.add_argument("file", help="config file (YAML or JSON, version: v1)")
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    # gRPC's C core logs transport chatter (GOAWAY on every kubelet restart) to stderr at INFO; it is
    # read when grpc is first imported, which happens below, lazily, after this.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    args_list = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if environ is None else environ)
    if not any(a in COMMANDS for a in args_list) and not {"-h", "--help", "--version"} & set(args_list):
        args_list.insert(0, "run")
    args = build_parser(env).parse_args(args_list)
    if args.command == "check-config":
        return _check_config(args.file)
    configure_logging(args.log_level, args.log_format)

    def load_config() -> Config:
        return resolve_config(args, env)

    try:
        if args.command == "plan":
            return _plan(args, load_config)
        if args.command == "labels":
            from nvidia_device_plugin.cli.labels import run_labels

            return run_labels(args, load_config)
        if args.command == "mps-control-daemon":
            from nvidia_device_plugin.cli.mps_control import run as run_mps_control_daemon

            return run_mps_control_daemon(args, env, load_config)
        if args.command == "demo":
            from nvidia_device_plugin.cli.demo import run_demo

            open_session, _simulator = nvml_opener(args.simulate)
            return run_demo(
                args.simulate, open_session, load_config, sys.stdout, pod_devices=args.pod_devices
            )
        return _run(args, env, load_config)
    except DevicePluginError as exc:
        log.error("%s", exc)  # logging goes to stderr: the one line an operator reads in `kubectl logs`
        return 1


def _check_config(path: str) -> int:
    from nvidia_device_plugin.snapshot import check_config_device_lists

    try:
        config = load_config_file(path)  # strict: unknown keys are errors here, warnings in the daemon
        check_config_device_lists(config)
    except DevicePluginError as exc:
        print(f"{exc}", file=sys.stderr)
        return 1
    for warning in config.warnings:
        print(f"warning: {warning.message}", file=sys.stderr)
    for problem in gfd_incompatibilities(config):
        print(f"warning: {path}: {problem}", file=sys.stderr)
    print(f"{path}: valid")
    return 0


def _plan(args: argparse.Namespace, load_config: Callable[[], Config]) -> int:
    from nvidia_device_plugin.cdi.view import cdi_to_json, render_cdi_summary
    from nvidia_device_plugin.cli.planview import plan_to_json, render_plan_table
    from nvidia_device_plugin.nvml.session import open_nvml
    from nvidia_device_plugin.snapshot import build_snapshot

    config = load_config()
    session = open_nvml(args.simulate)
    try:
        snapshot = build_snapshot(session, config)
    finally:
        session.close()
    cdi = snapshot.cdi
    if args.cdi_spec:
        if cdi is None or cdi.problem is not None:
            print(cdi.problem if cdi else "no CDI device-list strategy is configured", file=sys.stderr)
            return 1
        print(json.dumps({s.file_name: s.document for s in cdi.specs}, indent=2))
    elif args.output == "json":
        document = plan_to_json(snapshot.plans, snapshot.inventory)
        print(json.dumps({**document, "cdi": cdi_to_json(cdi)}, indent=2))
    else:
        print(render_plan_table(snapshot.plans, snapshot.inventory) + render_cdi_summary(cdi), end="\n")
    return 0


def nvml_opener(simulate: str | None) -> tuple[Callable[[], NvmlSession], SimulatedNvml | None]:
    """How the daemon opens NVML: the real library, or (for --simulate) a simulated node made here, so
    that the caller can drive the simulator (inject events) while the daemon uses it like real NVML."""
    from nvidia_device_plugin.nvml.session import open_nvml

    if not simulate:
        return open_nvml, None
    session = open_nvml(simulate)
    return (lambda: session), session.simulator


def _node_label_follower(args: argparse.Namespace, source: ConfigSource) -> NodeLabelConfig | None:
    """The in-process config-manager, when --node-config-label asks for one."""
    if not args.node_config_label:
        return None
    from nvidia_device_plugin.configmanager.inprocess import NodeLabelConfig

    if source.directory is None:
        raise ConfigError("--node-config-label chooses a file in --config-dir; give --config-dir")
    return NodeLabelConfig(
        args.node_name,
        args.node_config_label,
        source.directory,
        source.default_name or "",
        source.fallback_strategies,
    )


def _run(args: argparse.Namespace, environ: Mapping[str, str], load_config: Callable[[], Config]) -> int:
    from nvidia_device_plugin.daemon import Daemon, DaemonOptions
    from nvidia_device_plugin.nvml.sim.events import SimulatedEventFeeder

    source = config_source(args, environ)
    follower = _node_label_follower(args, source)
    if follower is not None:
        source = ConfigSource.from_file(follower.config_file)  # linked by the follower when it starts
        linked = source
        load_config = lambda: load_from(linked, args, environ)  # noqa: E731 (the file the label chose)

    def watcher(on_change: Callable[[], None]) -> ConfigWatcher:
        return ConfigWatcher(source, on_change)

    open_session, simulator = nvml_opener(args.simulate)
    if args.simulate_events and simulator is None:
        log.warning("--simulate-events %s ignored: it needs --simulate", args.simulate_events)
    daemon = Daemon(
        DaemonOptions(
            plugin_dir=Path(args.device_plugin_path),
            load_config=load_config,
            open_nvml=open_session,
            watch=watcher if source.watch_paths() else None,
            kubelet_socket=args.kubelet_socket,
            metrics_address=args.metrics_address or "",
            labels=labels_options(args),
            node_config=follower,
            simulated_events=(
                SimulatedEventFeeder(Path(args.simulate_events), simulator)
                if simulator is not None and args.simulate_events
                else None
            ),
        )
    )
    serve_until_stopped(daemon.start, daemon.reload, daemon.stop)  # the daemon starts and stops them all
    return 0

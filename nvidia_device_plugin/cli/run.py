"""`nvidia-device-plugin run` (the default command): the device-plugin daemon and its flags."""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.cli.common import AddParser, add_common_arguments, config_loader, env_value
from nvidia_device_plugin.cli.dra import add_run_arguments as add_dra_run_arguments
from nvidia_device_plugin.cli.dra import dra_options
from nvidia_device_plugin.cli.labels import add_labels_file_arguments, labels_options
from nvidia_device_plugin.nvml.deadlines import DEFAULT_CALL_TIMEOUT_S, MAX_CALL_TIMEOUT_S, MIN_CALL_TIMEOUT_S

if TYPE_CHECKING:
    from nvidia_device_plugin.base.workers import Worker
    from nvidia_device_plugin.config.source import ConfigSource
    from nvidia_device_plugin.config.watch import ConfigWatcher
    from nvidia_device_plugin.configmanager.inprocess import NodeLabelConfig
    from nvidia_device_plugin.daemons.run import Daemon
    from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml

log = logging.getLogger("nvidia_device_plugin")

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_METRICS_ADDRESS = ":9402"
NVML_CALL_DEADLINE_ENV = "NVDP_NVML_CALL_DEADLINE"


def add_parser(commands: AddParser, environ: Mapping[str, str]) -> None:
    run = commands("run", help="run the device plugin daemon (the default command)")
    add_common_arguments(run, environ)
    run.add_argument(
        "--device-plugin-path",
        default=env_value(environ, "DEVICE_PLUGIN_PATH", DEFAULT_PLUGIN_DIR),
        help=f"kubelet's device-plugin directory (default {DEFAULT_PLUGIN_DIR}) [env DEVICE_PLUGIN_PATH]",
    )
    run.add_argument(
        "--kubelet-socket",
        default=env_value(environ, "KUBELET_SOCKET", "kubelet.sock"),
        help="kubelet registration socket, relative to --device-plugin-path [env KUBELET_SOCKET]",
    )
    run.add_argument(
        "--node-config-label",
        default=env_value(environ, "NVDP_NODE_CONFIG_LABEL", ""),
        metavar="LABEL",
        help="choose the config in --config-dir by this label of the node "
        "(e.g. nvidia.com/device-plugin.config), followed live, with --config-default and "
        "--config-fallback-strategies as NVIDIA's config-manager uses them; needs NODE_NAME and "
        "list/watch on the node [env NVDP_NODE_CONFIG_LABEL]",
    )
    run.add_argument(
        "--node-name",
        default=env_value(environ, "NODE_NAME", ""),
        help="this node's name, for --node-config-label and the DRA mode (its pool) [env NODE_NAME]",
    )
    run.add_argument(
        "--simulate-events",
        metavar="FILE",
        default=env_value(environ, "NVDP_SIMULATE_EVENTS"),
        help="JSON-lines file of injected health events for --simulate [env NVDP_SIMULATE_EVENTS]",
    )
    run.add_argument(
        "--metrics-address",
        default=env_value(environ, "NVDP_METRICS_ADDRESS", DEFAULT_METRICS_ADDRESS),
        help=f"host:port for /metrics, /healthz, /readyz (default {DEFAULT_METRICS_ADDRESS}; empty disables) "
        "[env NVDP_METRICS_ADDRESS]",
    )
    run.add_argument(
        "--nvml-call-deadline",
        metavar="SECONDS",
        type=nvml_call_deadline,
        default=env_value(environ, NVML_CALL_DEADLINE_ENV, f"{DEFAULT_CALL_TIMEOUT_S:g}"),
        help=f"how long one NVML call may take before its GPU is served as unusable (default "
        f"{DEFAULT_CALL_TIMEOUT_S:g}, from {MIN_CALL_TIMEOUT_S:g} to {MAX_CALL_TIMEOUT_S:g}); a call "
        f"taking a quarter of it is counted and logged as slow [env {NVML_CALL_DEADLINE_ENV}]",
    )
    add_labels_file_arguments(run, environ)
    add_dra_run_arguments(run, environ)
    run.set_defaults(handler=run_daemon)


def nvml_call_deadline(text: str) -> float:
    """--nvml-call-deadline: seconds, within the bounds nvml/bounded.py names."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not MIN_CALL_TIMEOUT_S <= seconds <= MAX_CALL_TIMEOUT_S:  # NaN and infinities fail here too
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds from {MIN_CALL_TIMEOUT_S:g} to {MAX_CALL_TIMEOUT_S:g} (also as env "
            f"{NVML_CALL_DEADLINE_ENV}), got {text!r}"
        )
    return seconds


def _node_label_follower(args: argparse.Namespace, source: ConfigSource) -> NodeLabelConfig | None:
    """The in-process config-manager, when --node-config-label asks for one (the only `run` that imports
    the kubernetes client)."""
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


def _simulated_events(args: argparse.Namespace, simulator: SimulatedNvml | None) -> Worker | None:
    """The --simulate-events feeder, imported here: most runs (every real node) have none."""
    if simulator is None or not args.simulate_events:
        return None
    from nvidia_device_plugin.nvml.sim.events import SimulatedEventFeeder

    return SimulatedEventFeeder(Path(args.simulate_events), simulator)


def run_daemon(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from nvidia_device_plugin.base import collector
    from nvidia_device_plugin.base.signals import serve_until_stopped

    release_collector = collector.hold()  # from the daemon's imports until it serves (base/collector.py)
    try:
        daemon = _build_daemon(args, environ)

        def start() -> None:
            daemon.start()
            release_collector()

        serve_until_stopped(start, daemon.reload, daemon.stop)  # the daemon starts and stops them all
    finally:
        release_collector()
    return 0


def _build_daemon(args: argparse.Namespace, environ: Mapping[str, str]) -> Daemon:
    from nvidia_device_plugin.cli.session import nvml_opener
    from nvidia_device_plugin.config.flags import config_source, load_from
    from nvidia_device_plugin.daemons.run import Daemon, DaemonOptions

    load_config = config_loader(args, environ)
    source = config_source(args, environ)
    follower = _node_label_follower(args, source)
    if follower is not None:
        source = follower.source  # linked by the follower when it starts
        load_config = partial(load_from, source, args, environ)

    def watcher(on_change: Callable[[], None], defer_events: bool) -> ConfigWatcher:
        # Here: the config watch loads only when there is a config file to watch (start-up time and memory).
        from nvidia_device_plugin.config.watch import ConfigWatcher

        return ConfigWatcher(source, on_change, defer_events=defer_events)

    open_session, simulator = nvml_opener(args.simulate, args.nvml_call_deadline)
    if args.simulate_events and simulator is None:
        log.warning("--simulate-events %s ignored: it needs --simulate", args.simulate_events)
    return Daemon(
        DaemonOptions(
            plugin_dir=Path(args.device_plugin_path),
            load_config=load_config,
            open_nvml=open_session,
            watch=watcher if source.watch_paths() else None,
            kubelet_socket=args.kubelet_socket,
            metrics_address=args.metrics_address or "",
            count_metrics=bool(args.metrics_address),
            labels=labels_options(args),
            node_config=follower,
            dra=dra_options(args),
            simulated_events=_simulated_events(args, simulator),
        )
    )

"""`nvidia-device-plugin labels` and the `--labels-file` option of `run`."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.labels.nfd import DEFAULT_MACHINE_TYPE_FILE, read_machine_type, render_features
from nvidia_device_plugin.labels.node import LabelSettings, node_labels
from nvidia_device_plugin.labels.writer import LabelsOptions


def _env(environ: Mapping[str, str], name: str) -> str | None:
    return environ.get(name) or None


def add_labels_file_arguments(run: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    run.add_argument(
        "--labels-file",
        metavar="PATH",
        default=_env(environ, "NVDP_LABELS_FILE"),
        help="keep GPU Feature Discovery's node labels in this NFD features.d file, rewritten on every "
        "change (e.g. /etc/kubernetes/node-feature-discovery/features.d/nvidia-device-plugin) "
        "[env NVDP_LABELS_FILE]",
    )
    run.add_argument(
        "--machine-type-file",
        metavar="PATH",
        default=_env(environ, "NVDP_MACHINE_TYPE_FILE") or DEFAULT_MACHINE_TYPE_FILE,
        help=f"where nvidia.com/gpu.machine is read (default {DEFAULT_MACHINE_TYPE_FILE}) "
        "[env NVDP_MACHINE_TYPE_FILE]",
    )


def labels_options(args: argparse.Namespace) -> LabelsOptions | None:
    """The daemon's labels-file options from `run`'s arguments; None without --labels-file."""
    if not args.labels_file:
        return None
    return LabelsOptions(path=Path(args.labels_file), machine_type_file=args.machine_type_file)


def add_labels_command(commands: Callable[..., argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The `labels` subcommand; `commands` is the subparsers' add_parser. The caller adds the common flags."""
    sub = commands("labels", help="print the node labels (GPU Feature Discovery's and ours) of this node")
    sub.add_argument("--output", choices=("text", "json"), default="text")
    sub.add_argument("--no-timestamp", action="store_true", help="leave out nvidia.com/gfd.timestamp")
    sub.add_argument(
        "--machine-type-file",
        metavar="PATH",
        default=None,
        help=f"where nvidia.com/gpu.machine is read (default {DEFAULT_MACHINE_TYPE_FILE}; none with "
        "--simulate)",
    )
    return sub


def run_labels(args: argparse.Namespace, load_config: Callable[[], Config]) -> int:
    from nvidia_device_plugin.nvml.session import open_nvml
    from nvidia_device_plugin.snapshot import build_snapshot

    config = load_config()
    machine_file = args.machine_type_file
    if machine_file is None:
        machine_file = "" if args.simulate else DEFAULT_MACHINE_TYPE_FILE
    session = open_nvml(args.simulate)
    try:
        snapshot = build_snapshot(session, config)
    finally:
        session.close()
    settings = LabelSettings(no_timestamp=args.no_timestamp, machine_type=read_machine_type(machine_file))
    labels = node_labels(snapshot.inventory, snapshot.config, (), settings, timestamp=int(time.time()))
    if args.output == "json":
        print(json.dumps(labels, indent=2))
    else:
        print(render_features(labels), end="")
    return 0

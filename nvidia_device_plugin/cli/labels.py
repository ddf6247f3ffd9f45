"""`nvidia-device-plugin labels` and the `--labels-file` option of `run`."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from nvidia_device_plugin.cli.common import AddParser, add_common_arguments, env_value
from nvidia_device_plugin.config.flags import resolve_config
from nvidia_device_plugin.labels.nfd import DEFAULT_MACHINE_TYPE_FILE

if TYPE_CHECKING:
    from nvidia_device_plugin.labels.writer import LabelsOptions


def add_labels_file_arguments(run: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    run.add_argument(
        "--labels-file",
        metavar="PATH",
        default=env_value(environ, "NVDP_LABELS_FILE"),
        help="keep GPU Feature Discovery's node labels in this NFD features.d file, rewritten on every "
        "change (e.g. /etc/kubernetes/node-feature-discovery/features.d/nvidia-device-plugin) "
        "[env NVDP_LABELS_FILE]",
    )
    run.add_argument(
        "--machine-type-file",
        metavar="PATH",
        default=env_value(environ, "NVDP_MACHINE_TYPE_FILE", DEFAULT_MACHINE_TYPE_FILE),
        help=f"where nvidia.com/gpu.machine is read (default {DEFAULT_MACHINE_TYPE_FILE}) "
        "[env NVDP_MACHINE_TYPE_FILE]",
    )


def labels_options(args: argparse.Namespace) -> LabelsOptions | None:
    """The daemon's labels-file options from `run`'s arguments; None without --labels-file."""
    if not args.labels_file:
        return None
    from nvidia_device_plugin.labels.writer import LabelsOptions

    return LabelsOptions(path=Path(args.labels_file), machine_type_file=args.machine_type_file)


def add_parser(commands: AddParser, environ: Mapping[str, str]) -> None:
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
    add_common_arguments(sub, environ)
    sub.set_defaults(handler=print_labels)


def print_labels(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from nvidia_device_plugin.cli.session import open_session
    from nvidia_device_plugin.labels.nfd import read_machine_type, render_features
    from nvidia_device_plugin.labels.node import LabelSettings, node_labels
    from nvidia_device_plugin.snapshot import build_snapshot

    config = resolve_config(args, environ)
    machine_file = args.machine_type_file
    if machine_file is None:
        machine_file = "" if args.simulate else DEFAULT_MACHINE_TYPE_FILE
    session = open_session(args.simulate)
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

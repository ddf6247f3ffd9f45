"""`gpu-feature-discovery`: NVIDIA GFD's command line, labelling from this plugin's discovery.

Deployments that run NVIDIA's GFD can run this image instead: the flags and environment variables are
GFD's (`--oneshot`/GFD_ONESHOT, `--output-file`/GFD_OUTPUT_FILE, `--sleep-interval`/GFD_SLEEP_INTERVAL,
`--no-timestamp`/GFD_NO_TIMESTAMP, `--machine-type-file`/GFD_MACHINE_TYPE_FILE, `--mig-strategy`/
MIG_STRATEGY, `--fail-on-init-error`/FAIL_ON_INIT_ERROR, `--config-file`/CONFIG_FILE), and so is the
behaviour: label, sleep, label again; remove the output file on exit unless `--oneshot`.
`--use-node-feature-api` is accepted and ignored with a warning: labels always go to the output file.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from nvidia_device_plugin.cli.common import env_value
from nvidia_device_plugin.config.durations import parse_go_duration
from nvidia_device_plugin.config.flags import add_config_arguments, resolve_config
from nvidia_device_plugin.errors import DevicePluginError, NvmlError
from nvidia_device_plugin.labels.nfd import DEFAULT_MACHINE_TYPE_FILE, DEFAULT_OUTPUT_FILE
from nvidia_device_plugin.logs import LOG_LEVELS, configure_logging

if TYPE_CHECKING:
    from nvidia_device_plugin.config.v1 import Config
    from nvidia_device_plugin.labels.node import LabelSettings
    from nvidia_device_plugin.nvml.session import NvmlSession

log = logging.getLogger("gpu_feature_discovery")

_TRUE = {"1", "t", "true"}
_FALSE = {"0", "f", "false"}


def _go_bool(text: str, what: str) -> bool:
    """A boolean as Go's strconv.ParseBool reads it (GFD's flags and env vars)."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise DevicePluginError(f"{what} must be true or false, got {text!r}")


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    def env(name: str, default: str | None = None) -> str | None:
        return env_value(environ, name, default)

    parser = argparse.ArgumentParser(
        prog="gpu-feature-discovery",
        description="Write NVIDIA GPU Feature Discovery's node labels to an NFD features.d file.",
    )
    for flag, name in (
        ("--oneshot", "GFD_ONESHOT"),
        ("--no-timestamp", "GFD_NO_TIMESTAMP"),
        ("--use-node-feature-api", "GFD_USE_NODE_FEATURE_API"),
    ):
        parser.add_argument(
            flag, nargs="?", const="true", default=env(name, "false"), metavar="BOOL", help=f"[env {name}]"
        )
    parser.add_argument(
        "--output-file",
        "-o",
        default=env("GFD_OUTPUT_FILE", DEFAULT_OUTPUT_FILE),
        help=f"the features.d file (default {DEFAULT_OUTPUT_FILE}) [env GFD_OUTPUT_FILE]",
    )
    parser.add_argument(
        "--sleep-interval",
        default=env("GFD_SLEEP_INTERVAL", "60s"),
        help="time between labelling passes, a Go duration (default 60s) [env GFD_SLEEP_INTERVAL]",
    )
    parser.add_argument(
        "--machine-type-file",
        default=env("GFD_MACHINE_TYPE_FILE", DEFAULT_MACHINE_TYPE_FILE),
        help=f"where nvidia.com/gpu.machine is read (default {DEFAULT_MACHINE_TYPE_FILE}) "
        "[env GFD_MACHINE_TYPE_FILE]",
    )
    parser.add_argument(
        "--simulate",
        metavar="NODE",
        default=env("NVDP_SIMULATE"),
        help="label a simulated node (preset or YAML node file) [env NVDP_SIMULATE]",
    )
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=env("NVDP_LOG_LEVEL", "info"))
    add_config_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    args = build_parser(env).parse_args(list(sys.argv[1:] if argv is None else argv))
    configure_logging(args.log_level, "text")
    try:
        return _run(args, env)
    except DevicePluginError as exc:
        log.error("%s", exc)
        return 1


def _run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from nvidia_device_plugin.labels.nfd import read_machine_type, write_features
    from nvidia_device_plugin.labels.node import LabelSettings, without_timestamp

    oneshot = _go_bool(args.oneshot, "--oneshot")
    interval = parse_go_duration(args.sleep_interval)
    if interval is None or interval <= 0:
        raise DevicePluginError(
            f"--sleep-interval must be a positive duration such as 60s or 1m30s, got {args.sleep_interval!r}"
        )
    if _go_bool(args.use_node_feature_api, "--use-node-feature-api"):
        log.warning(
            "--use-node-feature-api is not supported: labels are written to %s for NFD's local source",
            args.output_file,
        )
    config = resolve_config(args, env)
    settings = LabelSettings(
        no_timestamp=_go_bool(args.no_timestamp, "--no-timestamp"),
        machine_type=read_machine_type(args.machine_type_file),
    )
    path = Path(args.output_file)
    session = _open(args.simulate, config)
    handled = {signal.SIGTERM, signal.SIGINT}
    if not oneshot:
        signal.pthread_sigmask(signal.SIG_BLOCK, handled)
    try:
        written: dict[str, str] | None = None
        while True:
            labels = _labels(session, config, settings)
            write_features(path, labels)
            if without_timestamp(labels) != written:
                log.info("wrote %d labels to %s", len(labels), path)
                written = without_timestamp(labels)
            if oneshot:
                return 0
            if signal.sigtimedwait(handled, interval) is not None:
                log.info("exiting: removing %s", path)
                path.unlink(missing_ok=True)
                return 0
    finally:
        if not oneshot:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, handled)
        if session is not None:
            session.close()


def _open(simulate: str | None, config: Config) -> NvmlSession | None:
    from nvidia_device_plugin.cli.session import open_session

    try:
        return open_session(simulate)
    except NvmlError as exc:
        if config.flags.fail_on_init_error:
            raise
        log.error("%s; failOnInitError is false, so only the timestamp is labelled", exc)
        return None


def _labels(session: NvmlSession | None, config: Config, settings: LabelSettings) -> dict[str, str]:
    from nvidia_device_plugin.labels.node import TIMESTAMP_LABEL, node_labels
    from nvidia_device_plugin.snapshot import build_snapshot

    now = int(time.time())
    if session is None:
        return {} if settings.no_timestamp else {TIMESTAMP_LABEL: str(now)}
    snapshot = build_snapshot(session, config)
    return node_labels(snapshot.inventory, snapshot.config, (), settings, timestamp=now)

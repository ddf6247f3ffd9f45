"""`nvidia-device-plugin`: builds the parser from the command modules and runs the command chosen.

Commands: run (the default), mps-control-daemon, demo, plan, check-config, labels; each lives in its own
module with an `add_parser` that declares its flags and its handler. Precedence: flag > env > config file
> default. `config-manager` and `gpu-feature-discovery` are programs of their own (config_manager.py,
gfd.py), with the command lines NVIDIA's images have.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from nvidia_device_plugin import __version__
from nvidia_device_plugin.cli import demo, dra, labels, mps_control, plan, run
from nvidia_device_plugin.cli.common import Command
from nvidia_device_plugin.cli.run import DEFAULT_PLUGIN_DIR
from nvidia_device_plugin.errors import DevicePluginError
from nvidia_device_plugin.logs import configure_logging

__all__ = ["COMMANDS", "DEFAULT_PLUGIN_DIR", "build_parser", "main"]

log = logging.getLogger("nvidia_device_plugin")

COMMANDS = ("run", "mps-control-daemon", "demo", "plan", "check-config", "labels", "dra")


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nvidia-device-plugin",
        description="Kubernetes device plugin for NVIDIA GPUs: whole GPUs, time-slicing, MPS and MIG.",
    )
    parser.add_argument("--version", action="version", version=f"nvidia-device-plugin {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run.add_parser(commands.add_parser, environ)
    mps_control.add_parser(commands.add_parser, environ)
    demo.add_parser(commands.add_parser, environ)
    plan.add_parser(commands.add_parser, environ)
    labels.add_parser(commands.add_parser, environ)
    plan.add_check_config_parser(commands.add_parser)
    dra.add_parser(commands.add_parser, environ)
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
    handler: Command = args.handler
    if args.command == "check-config":
        return handler(args, env)  # prints its own verdict: no log configuration, no NVML
    configure_logging(args.log_level, args.log_format)
    try:
        return handler(args, env)
    except DevicePluginError as exc:
        log.error("%s", exc)  # logging goes to stderr: the one line an operator reads in `kubectl logs`
        return 1

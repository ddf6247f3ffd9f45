"""`nvidia-device-plugin mps-control-daemon`: its flags beyond those it shares with `run`, and the command.

The long-running part (config -> wanted MPS daemons -> supervisor) is
nvidia_device_plugin/daemons/mps_control.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from nvidia_device_plugin.cli.common import (
    AddParser,
    add_common_arguments,
    config_loader,
    env_value,
    seconds_up_to,
)
from nvidia_device_plugin.sharing import CONTROL_EXECUTABLE, QUIT_TIMEOUT_S

if TYPE_CHECKING:
    from nvidia_device_plugin.config.watch import ConfigWatcher
    from nvidia_device_plugin.nvml.session import NvmlSession


def add_parser(commands: AddParser, environ: Mapping[str, str]) -> None:
    parser = commands(
        "mps-control-daemon", help="run the MPS control daemons of the GPUs the config shares with MPS"
    )
    add_common_arguments(parser, environ)
    parser.add_argument(
        "--mps-control-binary",
        default=env_value(environ, "NVDP_MPS_CONTROL_BINARY", CONTROL_EXECUTABLE),
        metavar="PATH",
        help=f"the MPS control program (default {CONTROL_EXECUTABLE}, looked up on PATH); a missing one "
        "is reported per GPU and leaves its replicas not ready [env NVDP_MPS_CONTROL_BINARY]",
    )
    parser.add_argument(
        "--mps-quit-timeout",
        type=seconds_up_to(3600),
        default=env_value(environ, "NVDP_MPS_QUIT_TIMEOUT", str(QUIT_TIMEOUT_S)),
        metavar="SECONDS",
        help=f"how long the `quit`s of one config change, and the exits of their daemons, may take in all "
        f"(default {QUIT_TIMEOUT_S:g}); a daemon still running then is logged and left running "
        "[env NVDP_MPS_QUIT_TIMEOUT]",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Run until SIGTERM/SIGINT; SIGHUP reloads the config. Leaves the MPS daemons running on exit."""
    from nvidia_device_plugin.base.signals import serve_until_stopped
    from nvidia_device_plugin.cli.session import open_session as open_nvml
    from nvidia_device_plugin.config.flags import config_source
    from nvidia_device_plugin.config.watch import ConfigWatcher
    from nvidia_device_plugin.daemons.mps_control import ControlDaemonOptions, MpsControlDaemon

    source = config_source(args, environ)

    def watcher(on_change: Callable[[], None]) -> ConfigWatcher:
        return ConfigWatcher(source, on_change)

    def open_session() -> NvmlSession:
        return open_nvml(args.simulate)  # opened when the daemon starts, as the plugin's daemon does

    daemon = MpsControlDaemon(
        ControlDaemonOptions(
            load_config=config_loader(args, environ),
            open_nvml=open_session,
            watch=watcher if source.watch_paths() else None,
            control_path=args.mps_control_binary,
            quit_timeout_s=args.mps_quit_timeout,
        )
    )
    serve_until_stopped(daemon.start, daemon.reload, daemon.stop)  # as `run` takes its signals
    return 0

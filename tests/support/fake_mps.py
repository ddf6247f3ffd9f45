"""A stand-in for nvidia-cuda-mps-control, shared by the MPS test files.

`-d` records its argv, environment and signal state, starts a long sleep as "the daemon" (named like the
control binary, as the real daemon's command line is) and writes its pid file; like the real one, it
refuses to start a second daemon for a pipe directory whose daemon still runs, whether or not the pid
file is still there (the fake keeps its daemon's pid outside the pipe directory, where tenants cannot
reach it). Without arguments it records the command read from stdin and carries out `quit`.
Files in `<dir>` change what it does, as a broken installation or driver would:

    refuse-start   `-d` fails
    big-output     `-d` fails after printing 2 MiB
    hang-quit      `quit` hangs (until killed)
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nvidia_device_plugin.config.v1 import Config
    from nvidia_device_plugin.daemons.mps_control import MpsControlDaemon
    from nvidia_device_plugin.nvml.session import NvmlSession

FAKE_CONTROL = """#!/bin/bash
set -u
pipe="$CUDA_MPS_PIPE_DIRECTORY"
instance="$pipe/../fake-instance"
alive() {
  [ -n "$1" ] && [ -e "/proc/$1" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}
if [ "${1:-}" = "-d" ]; then
  # Read with builtins, no child: a grep child once read this shell with SIGINT, SIGTERM and SIGCHLD
  # blocked (bash's own, around the fork), not the mask the process was started with.
  while IFS= read -r line; do
    case "$line" in SigBlk:*|SigIgn:*) printf '%s\n' "$line" ;; esac
  done < /proc/$$/status > "$pipe/../fake-signals"
  if [ -e "__DIR__/refuse-start" ]; then
    echo "refusing to start (test)" >&2
    exit 1
  fi
  if [ -e "__DIR__/big-output" ]; then
    echo "failing loudly (test)"
    head -c 2097152 /dev/zero | tr '\\0' x
    exit 1
  fi
  if [ -e "$instance" ] && alive "$(cat "$instance")"; then
    echo "An instance of this daemon is already running" >&2
    exit 1
  fi
  env > "$pipe/daemon.env"
  echo "$*" >> "$pipe/launches"
  (exec -a "$0" sleep 600) </dev/null >/dev/null 2>&1 &
  echo $! >> "$pipe/started-pids"
  echo $! > "$instance"
  echo $! > "$pipe/nvidia-cuda-mps-control.pid"
  exit 0
fi
read -r command
echo "$command" >> "$pipe/commands"
if [ "$command" = "quit" ]; then
  if [ -e "__DIR__/hang-quit" ]; then
    echo $$ >> "$pipe/started-pids"
    exec sleep 600
  fi
  kill "$(cat "$instance")"
fi
"""


def install_fake_control(directory: Path) -> str:
    path = directory / "nvidia-cuda-mps-control"
    path.write_text(FAKE_CONTROL.replace("__DIR__", str(directory)))
    path.chmod(0o755)
    return str(path)


def kill_fake_daemons(root: Path) -> None:
    """Whatever a test left running: only the sleeps the fake started, by their ids."""
    for pids in root.rglob("started-pids"):
        for pid in pids.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def started_control_daemon(
    load_config: Callable[[], Config],
    node: str | Callable[[], NvmlSession],
    control_path: str,
    **options: Any,
) -> MpsControlDaemon:
    """`mps-control-daemon` on the simulated `node` (a preset's name, or an opener of NVML), started,
    checking and backing off at test pace."""
    from nvidia_device_plugin.daemons.mps_control import ControlDaemonOptions, MpsControlDaemon
    from nvidia_device_plugin.nvml.session import open_nvml

    opener = (lambda: open_nvml(node)) if isinstance(node, str) else node
    paced = {"check_interval_s": 0.02, "backoff_initial_s": 0.02, "backoff_max_s": 0.1, **options}
    daemon = MpsControlDaemon(
        ControlDaemonOptions(load_config=load_config, open_nvml=opener, control_path=control_path, **paced)
    )
    daemon.start()
    return daemon

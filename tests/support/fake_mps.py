"""A stand-in for nvidia-cuda-mps-control, shared by the MPS test files.

`-d` records its argv and environment, starts a long sleep as "the daemon" and writes its pid file;
without arguments it records the command read from stdin and carries out `quit`. While the file
`<dir>/refuse-start` exists, `-d` fails, as a broken installation would.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

FAKE_CONTROL = """#!/bin/bash
set -u
pipe="$CUDA_MPS_PIPE_DIRECTORY"
if [ "${1:-}" = "-d" ]; then
  if [ -e "__DIR__/refuse-start" ]; then
    echo "refusing to start (test)" >&2
    exit 1
  fi
  env > "$pipe/daemon.env"
  echo "$*" >> "$pipe/launches"
  sleep 600 </dev/null >/dev/null 2>&1 &
  echo $! >> "$pipe/started-pids"
  echo $! > "$pipe/nvidia-cuda-mps-control.pid"
  exit 0
fi
read -r command
echo "$command" >> "$pipe/commands"
if [ "$command" = "quit" ]; then
  kill "$(cat "$pipe/nvidia-cuda-mps-control.pid")"
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

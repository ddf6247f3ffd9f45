"""The demo's MPS side: `mps-control-daemon` in the demo's own process, with a stand-in control program.

A simulated node has no MPS, so the demo cannot run `nvidia-cuda-mps-control`. It runs the real supervisor
(mps_control.MpsControlDaemon: compute modes, one control daemon per shared GPU, readiness files) with
`stand_in_control`, a small shell program that behaves as the control program does as far as the
supervisor can see: `-d` starts a server process and writes its pid into the pipe directory; a command on
standard input is accepted, and `quit` ends the server. The servers live under the demo's temporary MPS root,
exit by themselves when the demo's process is gone, and `stop_servers` ends them, by the pids they wrote, when
the demo ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from nvidia_device_plugin.sharing.mps_daemon import PID_FILE

_STAND_IN = """#!/bin/sh
# nvidia-device-plugin demo: a stand-in for nvidia-cuda-mps-control on a simulated node (no GPU, no MPS).
pid_file="$CUDA_MPS_PIPE_DIRECTORY/__PID_FILE__"
if [ "${1:-}" = "-d" ]; then
  # "The server": lives while the demo (pid __DEMO_PID__) does.
  (while kill -0 __DEMO_PID__ 2>/dev/null; do sleep 0.2; done) </dev/null >/dev/null 2>&1 &
  echo $! > "$pid_file"
  exit 0
fi
read -r command
if [ "$command" = "quit" ]; then
  kill "$(cat "$pid_file")" && rm -f "$pid_file"
fi
exit 0
"""


def stand_in_control(directory: Path) -> str:
    """Write the stand-in control program into `directory`; its path, for ControlDaemonOptions."""
    path = directory / "nvidia-cuda-mps-control"
    path.write_text(_STAND_IN.replace("__PID_FILE__", PID_FILE).replace("__DEMO_PID__", str(os.getpid())))
    path.chmod(0o755)
    return str(path)


def stop_servers(mps_root: Path) -> None:
    """End the stand-in servers started under `mps_root`, each by the pid it wrote."""
    for pid_file in mps_root.rglob(PID_FILE):
        with contextlib.suppress(ValueError, OSError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)

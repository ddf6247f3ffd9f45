"""The processes of MPS control daemons: finding one, telling it is still the same one, quitting them.

A daemon writes its pid into its pipe directory, which every client container of its GPU mounts read-write:
any tenant can delete that file, replace it (with a FIFO, another pid) or let it be. So the pid file is
only how a daemon is found first (after `-d`, or by a successor adopting it); from then on the supervisor
knows the process itself (`DaemonProcess`: its pid and start time, so a reused pid is another process) and
re-checks that, restoring the pid file when it went missing. A successor that finds no pid file falls back
to the pid in the GPU's status file (written by us, outside the tenants' mounts), if that process is still
a control daemon.

Quitting is bounded: `quit_daemons` sends every `quit` at once and waits for all of them, and for the
daemons to exit, within one deadline, and gives up at once when asked to stop.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.base import children
from nvidia_device_plugin.base.atomicfile import replace_file
from nvidia_device_plugin.base.boundedio import SMALL_FILE_BYTES, read_bytes, read_text
from nvidia_device_plugin.sharing.mps_specs import MpsDaemonSpec

PID_FILE = "nvidia-cuda-mps-control.pid"  # written by the control daemon into its pipe directory
_START_TIME_FIELD = 19  # of /proc/<pid>/stat after the ")" of the command name: field 22, starttime
_PAUSE_S = 0.02
_MAX_ENVIRON_BYTES = 256 * 1024


@dataclass(frozen=True)
class DaemonProcess:
    """One live process: its pid and its start time (clock ticks after boot), which a reused pid lacks."""

    pid: int
    started: str

    def still_running(self) -> bool:
        return live_process(self.pid) == self


def live_process(pid: int) -> DaemonProcess | None:
    """The process `pid` if it is alive (not a zombie); None otherwise."""
    if not pid_alive(pid):
        return None
    fields = _stat_fields(pid)
    started = fields[_START_TIME_FIELD] if len(fields) > _START_TIME_FIELD else ""
    return DaemonProcess(pid, started)


def running_pid(pipe_dir: str) -> int | None:
    """The pid in the daemon's pid file, if that process is alive (read bounded: a tenant may have put a
    FIFO or anything else there)."""
    try:
        pid = int(read_text(Path(pipe_dir, PID_FILE), SMALL_FILE_BYTES).strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def restore_pid_file(pipe_dir: str, pid: int) -> None:
    """Write `pid` into the pipe directory's pid file again (atomically: a symlink there is replaced, never
    followed). Raises OSError."""
    replace_file(Path(pipe_dir, PID_FILE), f"{pid}\n")


def is_control_daemon(pid: int, control_path: str, pipe_dir: str) -> bool:
    """Whether process `pid` is the control daemon of `pipe_dir`: its command line's first word names the
    control binary, and it was started with that pipe directory (a pid reused by any other process, or by
    another GPU's daemon, is not)."""
    try:
        command = read_bytes(f"/proc/{pid}/cmdline", SMALL_FILE_BYTES, truncate=True)
        environment = read_bytes(f"/proc/{pid}/environ", _MAX_ENVIRON_BYTES, truncate=True)
    except OSError:
        return False
    first = command.split(b"\0", 1)[0].decode(errors="replace")
    wanted = f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode()
    return os.path.basename(first) == os.path.basename(control_path) and wanted in environment.split(b"\0")


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: beyond pid_t, so no such process
        return False
    except PermissionError:
        return True
    # A killed daemon whose parent has not reaped it yet still answers kill(0): look at its state.
    fields = _stat_fields(pid)
    return not fields or fields[0] not in ("Z", "X")


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state first); empty when unreadable."""
    try:
        stat = read_text(f"/proc/{pid}/stat", SMALL_FILE_BYTES, errors="replace")
    except OSError:
        return []
    return stat.rpartition(")")[2].split()


@dataclass(frozen=True)
class QuitTarget:
    spec: MpsDaemonSpec
    pid: int


def quit_daemons(
    targets: Sequence[QuitTarget],
    control_path: str,
    base_env: Mapping[str, str],
    timeout_s: float,
    stop: threading.Event,
) -> dict[str, str]:
    """`echo quit | <control>` to every target at once; wait at most `timeout_s` in all for the commands
    and for the daemons to exit, less when `stop` (a threading.Event) is set. Returns, by pipe directory,
    "" for a daemon that stopped, else why it may still be running."""
    deadline = time.monotonic() + timeout_s
    sent: dict[str, tuple[QuitTarget, children.Child]] = {}
    results: dict[str, str] = {}
    for target in targets:
        env = {**base_env, **target.spec.env()}
        try:
            sent[target.spec.pipe_dir] = (target, children.start([control_path], env, b"quit\n"))
        except OSError as exc:
            results[target.spec.pipe_dir] = f"did not take 'quit': {exc}"
    for pipe_dir, (_, child) in sent.items():
        if not child.wait(deadline, stop):
            child.kill()
            why = "stopping" if stop.is_set() else f"no answer within {timeout_s:g}s"
            results[pipe_dir] = f"did not take 'quit' ({why})"
            continue
        outcome = child.outcome()
        if outcome.returncode != 0:
            results[pipe_dir] = f"did not take 'quit': exit status {outcome.returncode}: {outcome.output}"
    for pipe_dir, (target, _) in sent.items():
        if pipe_dir not in results:
            results[pipe_dir] = "" if _gone(target.pid, deadline, stop) else "still running after 'quit'"
    return results


def _gone(pid: int, deadline: float, stop: threading.Event) -> bool:
    while pid_alive(pid):
        if time.monotonic() >= deadline or stop.wait(_PAUSE_S):
            return not pid_alive(pid)
    return True

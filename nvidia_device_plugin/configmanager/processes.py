"""Finding and signalling the plugin process by its name, tolerantly.

NVIDIA's config-manager signals the process whose executable name (`/proc/<pid>/cmdline`'s first word) is
PROCESS_TO_SIGNAL. Ours runs as a script under the Python interpreter (`/usr/local/bin/nvidia-device-plugin`
exec'd by its `#!` line), so its first word is the interpreter; but the kernel names such a process after the
script: `/proc/<pid>/comm` is the script's basename, cut to 15 bytes. A process is therefore identified as
PROCESS_TO_SIGNAL when its comm is that name (cut as the kernel cuts it) and, where the cut hides the rest,
a word of its command line has the whole name as its basename. A name that only appears on a command line
(`bash /x/nvidia-device-plugin/build.sh`, `python3 nvidia-device-plugin demo`) is not the process, and one
whose comm or command line cannot be read is never signalled; nor is config-manager itself.

Signalling is a courtesy here: the daemon notices the re-pointed symlink by itself and reloads, so finding no
process is logged, never fatal. Seeing the plugin's processes from a sidecar needs `shareProcessNamespace:
true` in the pod.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from nvidia_device_plugin.base.boundedio import read_bytes

log = logging.getLogger(__name__)

MAX_COMMAND_LINE_BYTES = 64 * 1024  # enough for the words we look for; a longer command line is cut
COMM_BYTES = 15  # the kernel keeps a process name in TASK_COMM_LEN (16) bytes, its last a NUL
MAX_COMM_READ_BYTES = 64  # comm is at most 15 bytes and a newline; more is not a comm file


def _process_name(pid_dir: Path) -> str | None:
    """The kernel's name for the process (`comm`); None when it cannot be read."""
    try:
        raw = read_bytes(pid_dir / "comm", MAX_COMM_READ_BYTES)
    except OSError:  # gone meanwhile, not ours to read, or not a comm file
        return None
    return raw.removesuffix(b"\n").decode(errors="replace")


def _command_line(pid_dir: Path) -> list[str]:
    try:
        raw = read_bytes(pid_dir / "cmdline", MAX_COMMAND_LINE_BYTES, truncate=True)
    except OSError:  # gone meanwhile, or not ours to read
        return []
    return [word.decode(errors="replace") for word in raw.split(b"\0") if word]


def _is_named(pid_dir: Path, name: str) -> bool:
    """Whether the process is `name`: its comm is `name` as the kernel cuts it, and the whole name is on
    its command line when the cut hid part of it."""
    cut = name.encode()[:COMM_BYTES].decode(errors="ignore")
    if _process_name(pid_dir) != cut:
        return False
    if cut == name:
        return True
    return any(os.path.basename(word) == name for word in _command_line(pid_dir))


def find_processes(name: str, proc_root: Path = Path("/proc")) -> list[int]:
    """PIDs (other than ours) of the processes identified as `name` (see the module's docstring)."""
    found: list[int] = []
    try:
        entries = list(proc_root.iterdir())
    except OSError as exc:
        log.warning("cannot list processes in %s: %s", proc_root, exc.strerror or exc)
        return found
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        if _is_named(entry, name):
            found.append(int(entry.name))
    return sorted(found)


def _signal_if_named(pid: int, name: str, signum: int, proc_root: Path) -> bool:
    """Send `signum` to `pid` if it is still `name`: the pidfd pins the process while it is identified
    again, so a PID reused since `find_processes` is never signalled. False when it is gone or not `name`."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        if not _is_named(proc_root / str(pid), name):
            return False
        signal.pidfd_send_signal(pidfd, signum)
    finally:
        os.close(pidfd)
    return True


def signal_processes(name: str, signum: int, proc_root: Path = Path("/proc")) -> list[int]:
    """Send `signum` to every process named `name`; the PIDs signalled (none is fine, and logged)."""
    signalled: list[int] = []
    for pid in find_processes(name, proc_root):
        try:
            if not _signal_if_named(pid, name, signum, proc_root):
                continue
        except OSError as exc:
            log.warning("cannot send signal %d to %s (pid %d): %s", signum, name, pid, exc.strerror or exc)
            continue
        signalled.append(pid)
    if signalled:
        log.info("sent signal %d to %s (pid %s)", signum, name, ", ".join(map(str, signalled)))
    else:
        log.info(
            "no process named %s to signal; the device plugin reloads the re-pointed config by itself", name
        )
    return signalled

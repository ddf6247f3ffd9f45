"""Finding and signalling the plugin process, tolerantly.

NVIDIA's config-manager signals the process whose /proc/<pid>/cmdline starts with PROCESS_TO_SIGNAL. Ours
runs under the Python interpreter (`python3 /usr/local/bin/nvidia-device-plugin run`), so a process matches
when any word of its command line has PROCESS_TO_SIGNAL as its basename. Signalling is a courtesy here: the
daemon notices the re-pointed symlink by itself and reloads, so finding no process is logged, never fatal.
Seeing the plugin's processes from a sidecar needs `shareProcessNamespace: true` in the pod.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from nvidia_device_plugin.base.boundedio import read_bytes

log = logging.getLogger(__name__)

MAX_COMMAND_LINE_BYTES = 64 * 1024  # enough for the words we look for; a longer command line is cut


def _command_line(pid_dir: Path) -> list[str]:
    try:
        raw = read_bytes(pid_dir / "cmdline", MAX_COMMAND_LINE_BYTES, truncate=True)
    except OSError:  # gone meanwhile, or not ours to read
        return []
    return [word.decode(errors="replace") for word in raw.split(b"\0") if word]


def find_processes(name: str, proc_root: Path = Path("/proc")) -> list[int]:
    """PIDs (other than ours) whose command line has a word whose basename is `name`."""
    found: list[int] = []
    try:
        entries = list(proc_root.iterdir())
    except OSError as exc:
        log.warning("cannot list processes in %s: %s", proc_root, exc.strerror or exc)
        return found
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        words = _command_line(entry)
        if any(os.path.basename(word) == name for word in words):
            found.append(int(entry.name))
    return sorted(found)


def signal_processes(name: str, signum: int, proc_root: Path = Path("/proc")) -> list[int]:
    """Send `signum` to every process named `name`; the PIDs signalled (none is fine, and logged)."""
    signalled: list[int] = []
    for pid in find_processes(name, proc_root):
        try:
            os.kill(pid, signum)
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

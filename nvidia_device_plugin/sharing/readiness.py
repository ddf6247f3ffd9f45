"""MPS readiness: the file by which the control daemon tells the plugin that a GPU's MPS server is up.

The two run in different pods (the plugin has no hostPID and cannot look at the control daemon's process),
so they meet in the MPS root both mount: `mps-control-daemon` writes, per shared GPU,

    <mps_root>/<resource>/<gpu-uuid>/status.json
    {"ready": true, "pid": 4242, "reason": "running",
     "pinnedMemoryLimitMiB": 20480, "activeThreadPercentage": 25}

atomically (a temporary file renamed over it), whenever the GPU's control daemon starts, dies, fails to
start or is quit. The plugin (`run`) reads it: an MPS replica is Healthy only while its GPU's file says
ready. No file, a file that does not parse, or `"ready": false` all mean not ready, each with its reason.

The file outlives the control-daemon pod on purpose: a restart of that pod leaves the MPS servers (and
their clients) running, and the restarted command adopts them and rewrites the file.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.base.atomicfile import replace_file
from nvidia_device_plugin.base.boundedio import read_text
from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.base.workers import Worker

log = logging.getLogger(__name__)

STATUS_FILE = "status.json"
# A status is a few hundred bytes; its reason is cut to MAX_REASON_CHARS when it is written.
MAX_STATUS_BYTES = 64 * 1024
MAX_REASON_CHARS = 2048
DEFAULT_POLL_INTERVAL_S = 1.0
_POLL = "poll"  # the readiness watcher's one failure key: its last poll


@dataclass(frozen=True)
class GpuMpsStatus:
    """What the control daemon says about one GPU's MPS server."""

    ready: bool
    reason: str  # operator-readable: "running", "exited", "failed to start: ...", "not started yet"
    pid: int | None = None
    pinned_memory_limit_mib: int | None = None
    active_thread_percentage: int | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "ready": self.ready,
                "reason": cut_reason(self.reason),
                "pid": self.pid,
                "pinnedMemoryLimitMiB": self.pinned_memory_limit_mib,
                "activeThreadPercentage": self.active_thread_percentage,
            },
            sort_keys=True,
        )


def cut_reason(reason: str) -> str:
    """`reason`, cut to MAX_REASON_CHARS (a failing control binary may print megabytes), saying so."""
    if len(reason) <= MAX_REASON_CHARS:
        return reason
    return f"{reason[:MAX_REASON_CHARS]}... ({len(reason) - MAX_REASON_CHARS} more characters not shown)"


def status_path(mps_root: str, resource_name: str, gpu_uuid: str) -> str:
    return posixpath.join(mps_root, resource_name, gpu_uuid, STATUS_FILE)


def write_status(path: str, status: GpuMpsStatus) -> None:
    """Replace the status file atomically, so a reader sees the old or the new status, never half of one."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    replace_file(Path(path), status.to_json() + "\n")


def read_status(path: str) -> GpuMpsStatus:
    """The status in `path`; a missing or broken file reads as not ready, with the reason why.

    Read bounded (boundedio): the MPS root is on the node, so a FIFO, a device, a symlink out of the
    GPU's directory or a huge file may stand in its place; each reads as not ready, saying what it is.
    """
    try:
        text = read_text(path, MAX_STATUS_BYTES)
    except FileNotFoundError:
        return GpuMpsStatus(False, f"no MPS control daemon status at {path} (is mps-control-daemon running?)")
    except OSError as exc:
        return GpuMpsStatus(False, f"cannot read {path}: {exc.strerror or exc}")
    except ValueError:
        return GpuMpsStatus(False, f"{path} is not UTF-8 text")
    try:
        document = json.loads(text)
    except ValueError as exc:
        return GpuMpsStatus(False, f"{path} is not valid JSON: {exc}")
    if not isinstance(document, dict) or not isinstance(document.get("ready"), bool):
        return GpuMpsStatus(False, f"{path} has no boolean 'ready' field")
    pid = document.get("pid")
    reason = document.get("reason")
    return GpuMpsStatus(
        ready=document["ready"],
        reason=reason if isinstance(reason, str) else "",
        pid=pid if isinstance(pid, int) else None,
    )


@dataclass(frozen=True)
class ReadinessChange:
    """An MPS control daemon of a GPU became ready, or stopped being ready."""

    resource: str
    gpu_uuid: str
    ready: bool
    reason: str


class MpsReadinessWatcher(Worker):
    """The plugin's view of MPS readiness: which (resource, GPU) pairs have a ready control daemon.

    `watch()` names the pairs (at start and on every reload) and reads them at once, so the first
    ListAndWatch list after it is already right. Its thread ("mps-readiness") re-reads them every
    `poll_interval_s` and calls `on_change` once per flip (and for a pair's first reading), never per poll.
    """

    def __init__(
        self,
        on_change: Callable[[ReadinessChange], None],
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
    ) -> None:
        super().__init__("mps-readiness")
        self._on_change = on_change
        self._poll_interval_s = poll_interval_s
        self._lock = threading.Lock()
        self._paths: dict[tuple[str, str], str] = {}
        self._state: dict[tuple[str, str], GpuMpsStatus] = {}
        self._failures = FailureLog(log)

    def watch(self, mps_root: str, pairs: Iterable[tuple[str, str]]) -> None:
        """Watch exactly these (resource, GPU UUID) pairs under `mps_root` from now on."""
        paths = {pair: status_path(mps_root, *pair) for pair in pairs}
        with self._lock:
            self._paths = paths
            self._state = {p: s for p, s in self._state.items() if paths.get(p) is not None}
        self._poll()

    def not_ready_reason(self, resource: str, gpu_uuid: str) -> str | None:
        """None when the GPU's control daemon is ready; else why not (also for a pair not watched)."""
        with self._lock:
            status = self._state.get((resource, gpu_uuid))
        if status is None:
            return f"the MPS control daemon of GPU {gpu_uuid} ({resource}) has not been checked"
        return None if status.ready else status.reason

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self._poll_interval_s):
            try:
                self._poll()
            except Exception as exc:  # this thread must keep running; say so once per distinct reason
                self._failures.report(
                    _POLL,
                    f"MPS readiness check failed (will retry): {type(exc).__name__}: {exc}",
                    logging.ERROR,
                    exc_info=True,
                )
                continue
            self._failures.clear(_POLL)

    def _poll(self) -> None:
        with self._lock:
            paths = dict(self._paths)
        changes: list[ReadinessChange] = []
        for pair, path in paths.items():
            status = read_status(path)
            with self._lock:
                if self._paths.get(pair) != path:
                    continue  # a reload replaced the pairs meanwhile
                before = self._state.get(pair)
                self._state[pair] = status
            if before is None or before.ready != status.ready:
                changes.append(ReadinessChange(pair[0], pair[1], status.ready, status.reason))
        for change in changes:
            self._on_change(change)

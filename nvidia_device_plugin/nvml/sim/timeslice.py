"""The simulated node's compute time-slices (nvml/timeslice.py's TimeSliceControl), and their failures.

Each GPU starts at Default. `fail(gpu_uuid, code)` makes every later set on that GPU fail with `code`
(NOT_SUPPORTED: a GPU before Volta, where nvidia-smi says "Not Supported"; NO_PERMISSION: a container
without CAP_SYS_ADMIN) until `clear(gpu_uuid)`.

A real GPU's time-slice can be read from outside the process that set it (`nvidia-smi compute-policy -l`);
the simulator's lives in one process, so `record_to(path)` makes it keep a JSON copy (GPU UUID ->
interval, replaced atomically on every set) there, which a test of a daemon process reads.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pynvml

from nvidia_device_plugin.base.atomicfile import replace_file
from nvidia_device_plugin.nvml.timeslice import TimeSliceInterval, time_slice_error

_REASONS = {
    pynvml.NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    pynvml.NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
}


class SimulatedTimeSlice:
    """The time-slice of each GPU of a simulated node, by UUID; `sets` lists every successful set."""

    def __init__(self, gpu_uuids: list[str]) -> None:
        self._intervals: dict[str, TimeSliceInterval] = dict.fromkeys(gpu_uuids, "Default")
        self._failing: dict[str, int] = {}
        self._lock = threading.Lock()
        self.sets: list[tuple[str, TimeSliceInterval]] = []
        self._record: Path | None = None

    def set_time_slice(self, gpu_uuid: str, interval: TimeSliceInterval) -> None:
        with self._lock:
            if gpu_uuid not in self._intervals:
                code = pynvml.NVML_ERROR_NOT_FOUND
                raise time_slice_error(gpu_uuid, interval, "No devices were found", code)
            if (code := self._failing.get(gpu_uuid)) is not None:
                raise time_slice_error(gpu_uuid, interval, _REASONS.get(code, f"NVML error {code}"), code)
            self._intervals[gpu_uuid] = interval
            self.sets.append((gpu_uuid, interval))
            self._write_record()

    # ---- simulation controls --------------------------------------------------------------------

    def interval(self, gpu_uuid: str) -> TimeSliceInterval:
        with self._lock:
            return self._intervals[gpu_uuid]

    def record_to(self, path: Path) -> None:
        """Keep a copy of every GPU's interval in `path` (JSON, GPU UUID -> interval), from now on."""
        with self._lock:
            self._record = path
            self._write_record()

    def fail(self, gpu_uuid: str, code: int) -> None:
        with self._lock:
            self._failing[gpu_uuid] = code

    def clear(self, gpu_uuid: str) -> None:
        with self._lock:
            self._failing.pop(gpu_uuid, None)

    def _write_record(self) -> None:
        if self._record is not None:  # holding self._lock
            replace_file(self._record, json.dumps(self._intervals, sort_keys=True) + "\n")

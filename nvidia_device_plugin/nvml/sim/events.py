"""`--simulate-events FILE`: a JSON-lines file whose lines become events on a SimulatedNvml.

One object per line:

    {"gpu": 0, "xid": 79}                  XID on GPU 0 ("gpu" is a GPU index, GPU UUID or MIG UUID)
    {"gpu": "MIG-...", "xid": 94}          XID attributed to that MIG device
    {"gpu": 1, "ecc": "double-bit"}        double-bit ECC error
    {"gpu": 3, "lost": true}               GPU 3 falls off the bus; {"lost": false} brings it back
    {"gpu": 2, "hang": "nvmlDeviceGetMemoryInfo", "seconds": 30}
                                           that call on GPU 2 blocks for 30 s (no "seconds": until
                                           released); "gpu": "any" hangs it on every device
    {"gpu": 2, "release": "nvmlDeviceGetMemoryInfo"}   ends that hang

The file is read from its beginning (it is the scenario) and then followed: it may appear after start,
lines may be appended at any time, a last line without its newline waits for it, and a truncated or
replaced file is read again from its start. Malformed lines are logged once each, with their line
number, and skipped. Events reach the plugin only through the simulator, so the real health loop
handles them.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers.api import BaseObserver

from nvidia_device_plugin.base.boundedio import open_regular
from nvidia_device_plugin.base.fswatch import stop_watching, watch_directories
from nvidia_device_plugin.base.workers import Worker

log = logging.getLogger(__name__)

_MAX_LINE_BYTES = 64 * 1024  # longer lines are malformed; this bounds the partial-line buffer
_READ_BYTES = 1024 * 1024
_SHOWN_CHARS = 120  # of a malformed line, in its log line
_KINDS = ("xid", "ecc", "lost", "hang", "release")


class EventSink(Protocol):
    """The simulator controls the feeder drives (SimulatedNvml has them)."""

    def inject_xid(self, target: int | str, xid: int) -> None: ...
    def inject_ecc_double_bit(self, target: int | str) -> None: ...
    def set_lost(self, target: int | str, lost: bool) -> None: ...
    def hang(
        self, function_name: str, target: int | str | None = None, seconds: float | None = None
    ) -> None: ...
    def release(self, function_name: str | None = None, target: int | str | None = None) -> None: ...


@dataclass(frozen=True)
class SimEvent:
    """One parsed line."""

    target: int | str | None  # None: "any" (hang and release only)
    kind: str  # "xid", "ecc", "lost", "hang", "release"
    xid: int | None = None
    lost: bool | None = None
    call: str = ""  # for hang and release
    seconds: float | None = None  # for hang; None: until released

    def apply(self, sink: EventSink) -> None:
        if self.kind == "hang":
            sink.hang(self.call, self.target, self.seconds)
        elif self.kind == "release":
            sink.release(self.call, self.target)
        elif self.target is None:
            raise ValueError(f'"gpu": "any" applies to hang and release only, not {self.kind}')
        elif self.kind == "xid" and self.xid is not None:
            sink.inject_xid(self.target, self.xid)
        elif self.kind == "ecc":
            sink.inject_ecc_double_bit(self.target)
        elif self.kind == "lost" and self.lost is not None:
            sink.set_lost(self.target, self.lost)


class MalformedEvent(ValueError):
    """A line that is not a valid event; the message says what is wrong with it."""


def parse_event(line: str) -> SimEvent:
    """Parse one line; raises MalformedEvent naming the problem."""
    try:
        doc: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise MalformedEvent(f"not JSON: {exc.msg}") from exc
    if not isinstance(doc, dict):
        raise MalformedEvent(f"must be a JSON object, got {line.strip()!r}")
    target = doc.get("gpu")
    if isinstance(target, bool) or not isinstance(target, int | str):
        raise MalformedEvent(f'"gpu" must be a GPU index, GPU UUID or MIG UUID, got {target!r}')
    if isinstance(target, int) and target < 0:
        raise MalformedEvent(f'"gpu" must be >= 0, got {target}')
    kinds = [k for k in _KINDS if k in doc]
    unknown = sorted(set(doc) - {"gpu", "seconds", *_KINDS})
    if unknown:
        raise MalformedEvent(f'unknown field "{unknown[0]}" (known: gpu, {", ".join(_KINDS)}, seconds)')
    if len(kinds) != 1:
        raise MalformedEvent(f"needs exactly one of {', '.join(map(repr, _KINDS))}, got {kinds or 'none'}")
    kind = kinds[0]
    if kind in ("hang", "release"):
        return _parse_hang(doc, kind, None if target == "any" else target)
    if "seconds" in doc:
        raise MalformedEvent('"seconds" goes with "hang" only')
    value = doc[kind]
    if kind == "xid":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise MalformedEvent(f'"xid" must be a non-negative integer, got {value!r}')
        return SimEvent(target=target, kind="xid", xid=value)
    if kind == "ecc":
        if value != "double-bit":
            raise MalformedEvent(f'"ecc" must be "double-bit", got {value!r}')
        return SimEvent(target=target, kind="ecc")
    if not isinstance(value, bool):
        raise MalformedEvent(f'"lost" must be true or false, got {value!r}')
    return SimEvent(target=target, kind="lost", lost=value)


def _parse_hang(doc: dict[str, Any], kind: str, target: int | str | None) -> SimEvent:
    call = doc[kind]
    if not isinstance(call, str) or not call.startswith("nvml"):
        raise MalformedEvent(
            f'"{kind}" must name a pynvml call such as "nvmlDeviceGetMemoryInfo", got {call!r}'
        )
    seconds = doc.get("seconds")
    if kind == "release" and seconds is not None:
        raise MalformedEvent('"seconds" goes with "hang" only')
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0
    ):
        raise MalformedEvent(f'"seconds" must be a positive number, got {seconds!r}')
    return SimEvent(target=target, kind=kind, call=call, seconds=None if seconds is None else float(seconds))


class _Wake(FileSystemEventHandler):
    def __init__(self, path: Path, wake: threading.Event) -> None:
        self._name = path.name
        self._wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        for path in (event.src_path, getattr(event, "dest_path", "")):
            if path and os.path.basename(str(path)) == self._name:
                self._wake.set()


class SimulatedEventFeeder(Worker):
    """Follows `path` on a worker thread ("sim-events") and applies each line to `sim`.

    An inotify watch (watchdog) on the file's directory wakes the reader as soon as a line is
    appended, so an injected event reaches NVML in about a millisecond; the poll every
    `poll_interval_s` only covers filesystems where inotify says nothing.
    """

    def __init__(self, path: Path, sim: EventSink, poll_interval_s: float = 0.5) -> None:
        super().__init__("sim-events")
        self._path = path
        self._sim = sim
        self._poll_interval_s = poll_interval_s
        self._wake = threading.Event()
        self._observer: BaseObserver | None = None
        self._file: BinaryIO | None = None  # None while the path does not exist
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self._offset = 0
        self._partial = b""
        self._skipping = False  # inside an over-long line: drop bytes until its newline
        self._line_number = 0
        self._applied = 0
        self._read_error: str | None = None  # the last one logged, so a lasting error is logged once

    @property
    def applied_events(self) -> int:
        """Lines applied to the simulator so far."""
        return self._applied

    def start(self) -> None:
        if not self.started:  # a second start raises in Worker.start, before a second watch is made
            log.info("simulated events: following %s", self._path)
            if self._path.parent.is_dir():
                self._observer = watch_directories(
                    [self._path.parent], _Wake(self._path, self._wake), "sim-events-watch"
                )
        super().start()

    def stop(self, timeout: float | None = None) -> None:
        super().stop(timeout)
        if self._observer is not None:
            stop_watching(self._observer)
            self._observer = None
        self._close()

    def wake(self) -> None:
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.poll()
                self._read_error = None
            except OSError as exc:
                if str(exc) != self._read_error:
                    log.warning("simulated events: reading %s failed: %s; retrying", self._path, exc)
                    self._read_error = str(exc)
                self._close()
            except Exception as exc:  # a bug must not end the feeder: log it once and go on
                if repr(exc) != self._read_error:
                    log.exception("simulated events: handling %s failed; continuing", self._path)
                    self._read_error = repr(exc)
            self._wake.wait(self._poll_interval_s)
            self._wake.clear()

    def poll(self) -> None:
        """Read whatever is new in the file and apply its complete lines (the thread calls this)."""
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            if self._file is not None:
                log.info("simulated events: %s was removed; waiting for it to come back", self._path)
                self._close()
            return
        identity = (st.st_dev, st.st_ino)
        if self._file is not None and (identity != self._identity or st.st_size < self._offset):
            log.info("simulated events: %s was truncated or replaced; reading it from the start", self._path)
            self._close()
        if self._file is None:
            # A regular file only, opened without blocking (a FIFO would hang this thread); held open
            # across polls, closed in _close.
            self._file = os.fdopen(open_regular(self._path, symlinks="any"), "rb")
            opened = os.fstat(self._file.fileno())
            self._identity = (opened.st_dev, opened.st_ino)
        file = self._file
        while chunk := file.read(_READ_BYTES):
            self._offset += len(chunk)
            self._feed(chunk)

    def _feed(self, chunk: bytes) -> None:
        if self._skipping:
            newline = chunk.find(b"\n")
            if newline < 0:
                return
            chunk = chunk[newline + 1 :]
            self._line_number += 1
            self._skipping = False
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for raw in lines:
            self._line_number += 1
            self._line(raw)
        if len(self._partial) > _MAX_LINE_BYTES:
            log.warning(
                "simulated events: %s line %d is longer than %d bytes; skipped",
                self._path,
                self._line_number + 1,
                _MAX_LINE_BYTES,
            )
            self._partial = b""
            self._skipping = True

    def _line(self, raw: bytes) -> None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self._malformed("not UTF-8")
            return
        if not text.strip():
            return
        try:
            event = parse_event(text)
        except MalformedEvent as exc:
            self._malformed(str(exc), text)
            return
        except (RecursionError, ValueError) as exc:  # json nested too deep, or a number too long
            self._malformed(f"not a valid event: {type(exc).__name__}", text)
            return
        try:
            event.apply(self._sim)
        except Exception as exc:  # the simulator rejects the target (ValueError) or an NVML call fails
            self._malformed(f"the simulator refused it: {exc}")
            return
        self._applied += 1

    def _malformed(self, why: str, text: str = "") -> None:
        shown = ascii(text[:_SHOWN_CHARS]) + ("..." if len(text) > _SHOWN_CHARS else "")  # escaped
        log.warning("simulated events: %s line %d skipped: %s: %s", self._path, self._line_number, why, shown)

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._identity = None
        self._offset = 0
        self._partial = b""
        self._skipping = False
        self._line_number = 0

"""Log set-up: readable lines by default, one JSON object per line for log pipelines.

Log lines quote strings that come from outside (device IDs, resource names, file contents), and a newline
in one must not forge a line. In text format every control character of a message is escaped (a newline
becomes the two characters `\\n`), and the lines of a traceback are indented, so a line that starts at
column 0 is always the start of a real record. JSON is safe by construction: json.dumps escapes control
characters, and ensure_ascii escapes the Unicode line separators too.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable

from nvidia_device_plugin.base.workers import Worker

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
# RateLimitedLog's defaults: lines per key and window.
RATE_LIMIT_BURST = 5
RATE_LIMIT_WINDOW_S = 10.0

# C0 controls, DEL, C1 controls and the Unicode line and paragraph separators, which some viewers break on.
_UNSAFE = [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPES = {c: _NAMED.get(chr(c), f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _UNSAFE}


def escape_controls(text: str) -> str:
    """`text` on one line: control characters written as escapes (`\\n`, `\\x1b`, `\\u2028`)."""
    return text.translate(_ESCAPES)


class TextFormatter(logging.Formatter):
    """One line per record; a traceback follows on indented lines."""

    def __init__(self, fmt: str = TEXT_FORMAT) -> None:
        super().__init__(fmt)

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        line = escape_controls(self.formatMessage(record))
        # Not record.exc_text: another handler may have cached it unescaped.
        blocks = [self.formatException(record.exc_info)] if record.exc_info else []
        if record.stack_info:
            blocks.append(self.formatStack(record.stack_info))
        for block in blocks:
            line += "".join(f"\n    {escape_controls(part)}" for part in block.rstrip("\n").split("\n"))
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "thread": record.threadName,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        # ensure_ascii (the default, stated here because the one-line guarantee rests on it).
        return json.dumps(entry, sort_keys=False, ensure_ascii=True)


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # grpc and watchdog are chatty at debug level and say nothing an operator needs.
    for noisy in ("watchdog", "grpc"):
        logging.getLogger(noisy).setLevel(max(logging.INFO, root.level))


class FailureLog:
    """Failures of retried work, by what failed: each logged once per distinct reason, and kept for health.

    The one "log once per reason" of the project: a thread that retries (registration, a file watch, a
    writer, a discovery problem seen on every reload) reports each failure here under a key naming what
    failed; the same message again is not logged again, a different one is, and `clear` marks recovery.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._lock = threading.Lock()
        self._reasons: dict[str, str] = {}

    def report(self, key: str, message: str, level: int = logging.WARNING, exc_info: bool = False) -> bool:
        """Log `message` unless it is `key`'s failure already; True when logged. `exc_info` adds the
        traceback of the exception being handled (for failures that are bugs rather than conditions)."""
        with self._lock:
            if self._reasons.get(key) == message:
                return False
            self._reasons[key] = message
        self._log.log(level, "%s", message, exc_info=exc_info or None)  # None, not False, when not asked
        return True

    def report_first(
        self, key: str, message: str, level: int = logging.WARNING, exc_info: bool = False
    ) -> bool:
        """Log `message` only when `key` has no failure yet; True when logged. For a failure many things
        share (one NVML error code on every GPU): the first one's line speaks for all until `clear`."""
        with self._lock:
            if key in self._reasons:
                return False
            self._reasons[key] = message
        self._log.log(level, "%s", message, exc_info=exc_info or None)  # None, not False, when not asked
        return True

    def clear(self, key: str) -> bool:
        """Forget `key`'s failure; True when there was one (the caller logs the recovery)."""
        with self._lock:
            return self._reasons.pop(key, None) is not None

    def clear_all(self) -> bool:
        """Forget every failure; True when there was one (the caller logs the recovery)."""
        with self._lock:
            had, self._reasons = bool(self._reasons), {}
            return had

    def __len__(self) -> int:
        """How many failures are outstanding (for a caller that bounds what it keeps)."""
        with self._lock:
            return len(self._reasons)

    def reason(self, key: str) -> str | None:
        with self._lock:
            return self._reasons.get(key)


class RateLimitedLog(Worker):
    """Lines that can repeat without bound (a flapping GPU's health), limited per key: at most `burst`
    lines per `window_s` seconds. The rest are counted, and when the window ends one line says how many
    were left out and what the last of them said, so the final state is always in the log.

    The summaries are written by the log's own worker thread (`name`), which the daemon that owns the log
    starts and stops with its other workers; stop() writes the summaries still pending, whether their
    window ended or not, so none is lost on shutdown. The thread is made when the first line is left out
    (Worker.start_thread): a log that never leaves one out, as most never do, runs none.

    `clock` tells the windows' time (time.monotonic); the worker sleeps as long as it says a window has
    left, so a clock that is moved by hand needs a wake() after each move.
    """

    def __init__(
        self,
        logger: logging.Logger,
        burst: int | None = None,
        window_s: float | None = None,
        name: str = "log-summaries",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name)
        self._log = logger
        self._clock = clock
        self._burst = RATE_LIMIT_BURST if burst is None else burst
        self._window_s = RATE_LIMIT_WINDOW_S if window_s is None else window_s
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._windows: dict[str, _Window] = {}
        # The windows with lines left out: one summary each when the window ends (at most one per key and
        # window, as kept in `_windows`).
        self._pending: list[tuple[str, _Window]] = []

    def log(self, key: str, level: int, message: str, *args: object) -> bool:
        """Log `message % args` unless `key` has had `burst` lines in this window; True when logged."""
        now = self._clock()
        first = False
        with self._lock:
            window = self._windows.get(key)
            if window is None or now - window.start >= self._window_s:
                self._windows[key] = window = _Window(now)
            left_out = window.logged >= self._burst
            if left_out:
                first = window.suppressed == 0
                window.suppressed += 1
                window.last = (level, message, args)
                if first:  # said once the window ends, by the worker thread
                    self._pending.append((key, window))
                    self._changed.notify()
            else:
                window.logged += 1
        if not left_out:
            self._log.log(level, message, *args)
            return True
        if first:
            self.start_thread()  # the first summary to write: the thread setup() put off, if not made yet
        return False

    def setup(self) -> bool:
        with self._lock:
            return bool(self._pending)  # a thread now only for lines left out before the start

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            for key, window in self._due(stop):
                self._flush(key, window)

    def wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def cleanup(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for key, window in pending:
            self._flush(key, window)

    def _due(self, stop: threading.Event) -> list[tuple[str, _Window]]:
        """The windows whose summary is due, waiting until one is or `stop` is set."""
        with self._changed:
            while not stop.is_set():
                now = self._clock()
                due = [(key, w) for key, w in self._pending if w.start + self._window_s <= now]
                if due:
                    self._pending = [p for p in self._pending if p not in due]
                    return due
                ends = [w.start + self._window_s for _, w in self._pending]
                self._changed.wait(min(ends) - now if ends else None)
            return []

    def _flush(self, key: str, window: _Window) -> None:
        with self._lock:
            if self._windows.get(key) is window:
                del self._windows[key]
            suppressed, last = window.suppressed, window.last
        if last is None:
            return
        level, message, args = last
        try:
            self._log.log(
                level,
                f"{suppressed} more line(s) about {key} left out in {self._window_s:g}s; the last: {message}",
                *args,
            )
        except Exception:  # the summary thread must not die with a traceback over a log line
            self._log.exception("logging the summary of %s failed", key)


class _Window:
    def __init__(self, start: float) -> None:
        self.start = start
        self.logged = 0
        self.suppressed = 0
        self.last: tuple[int, str, tuple[object, ...]] | None = None

"""Live reload: call back once per real change of the config a `ConfigSource` names.

kubelet updates a mounted ConfigMap atomically: it writes the new content into a fresh `..<timestamp>/`
directory, points a temporary symlink at it and renames that over `..data`; `config.yaml` itself is a symlink
to `..data/config.yaml` and never changes. So the watch is on the mount directory (watchdog, inotify on
Linux), and every event there only means "look again": the watcher compares a hash of what the source
resolves to now with the last one and calls back only when it differs. A touch, or a rewrite with the same
bytes, does not call back; a change to a file that does not parse does (the daemon decides what to do).

Events are debounced (`debounce_seconds` of quiet before looking) so that a burst of events is one look.
A cheap look every `poll_interval_seconds` backs the events up, because inotify can miss changes: the watched
directory may not exist yet when the watch starts (the volume mounts later), may be replaced wholesale (the
old inode's watch goes dead), the kernel's event queue may overflow, and some filesystems (NFS, FUSE) deliver
no events at all. Hashing a small file every few seconds costs nothing next to missing a reconfiguration.

The watcher thread must outlive anything the filesystem does: a config that cannot be found or read (an
unreadable ConfigMap directory, a FIFO, a file too big) is part of the fingerprint, so it is noticed as a
change and again when it is readable again; any other failure of a look is logged once per distinct reason
and the next look goes on.

Start the watcher before the first load: a change between the load and `start()` would otherwise be missed.
With `defer_events`, `start()` only takes the first fingerprint; the event watch (watchdog's import, three
threads and the inotify watches: about 40 ms of CPU) is made at the thread's first look, once
`watch_events()` is called or a poll interval has passed. That first look compares the content with the
first fingerprint, so a change in between is still seen. `run` defers it until kubelet has every resource
registered.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from nvidia_device_plugin.base.digests import sha256  # not hashlib: its OpenSSL costs memory
from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.base.workers import Worker
from nvidia_device_plugin.config.document import read_config_bytes
from nvidia_device_plugin.config.source import ConfigSource

if TYPE_CHECKING:  # watchdog (base/fswatch.py) loads with the first event watch: deferred by `run`
    from watchdog.observers.api import BaseObserver

log = logging.getLogger(__name__)

# Reading the file ourselves produces these; reacting to them would make every look trigger the next one.
_READ_ONLY_EVENTS = frozenset({"opened", "closed_no_write"})

Fingerprint = tuple[str, str] | None  # (path resolved to, content hash), None when there is no file
_UNRESOLVED = "<unresolved>"  # in place of the path when the source names no readable file


def fingerprint(source: ConfigSource) -> Fingerprint:
    """What the source names now: the path it resolves to and a hash of that file's bytes.

    A source that cannot be resolved or read has the error as its fingerprint: a later fix is a change.
    The read is the loader's own (bounded, never blocking), so a FIFO cannot hang the watcher.
    """
    try:
        path = source.resolve()
    except ConfigError as exc:
        return (_UNRESOLVED, str(exc))
    if path is None:
        return None
    try:
        data = read_config_bytes(path)
    except ConfigError as exc:
        return (str(path), f"<unreadable: {exc}>")
    return (str(path), sha256(data).hexdigest())


def _describe(current: Fingerprint, source: ConfigSource) -> str:
    if current is None:
        return source.describe()
    where, content = current
    if where == _UNRESOLVED:
        return f"{source.describe()} ({content})"
    if content.startswith("<"):  # a hash never does
        return f"{where} {content}"
    return where


class ConfigWatcher(Worker):
    """Calls `on_change()` from its thread ("config-watcher") whenever the content behind `source` changes."""

    join_timeout_s = 5.0  # stop() waits this long for a running `on_change` to return

    def __init__(
        self,
        source: ConfigSource,
        on_change: Callable[[], object],
        debounce_seconds: float = 0.2,
        poll_interval_seconds: float = 5.0,
        defer_events: bool = False,
    ) -> None:
        super().__init__("config-watcher")
        self._source = source
        self._on_change = on_change
        self._debounce = debounce_seconds
        self._poll_interval = poll_interval_seconds
        self._dirty = threading.Event()
        self._lock = threading.Lock()  # guards _observer between the worker and stop()
        self._last: Fingerprint = None
        self._checks = 0
        self._observer: BaseObserver | None = None
        self._failures = FailureLog(log)  # a look that failed; the event watch that cannot be made
        self._defer_events = defer_events  # the event watch is made by the thread's first look (module doc)
        self._events_wanted = threading.Event()  # that look may come now: watch_events(), or the stop

    @property
    def checks_done(self) -> int:
        """How many times the content has been compared so far (for tests and debugging)."""
        return self._checks

    @property
    def watching_events(self) -> bool:
        """Whether filesystem events are being received (False: only the periodic check runs)."""
        with self._lock:
            return self._observer is not None

    def setup(self) -> bool:
        """The first fingerprint, and the event watch unless deferred, before start() returns: a change
        after it is seen."""
        self._last = fingerprint(self._source)
        if not self._defer_events:
            self._ensure_observer()
        log.info("watching %s for changes", self._source.describe())
        return True

    def watch_events(self) -> None:
        """Make the deferred event watch now (at the thread's first look); idempotent."""
        self._events_wanted.set()

    def wake(self) -> None:
        self._events_wanted.set()
        self._dirty.set()
        with self._lock:
            observer, self._observer = self._observer, None
        if observer is not None:
            from nvidia_device_plugin.base.fswatch import stop_watching  # loaded with the observer

            stop_watching(observer, self.join_timeout_s)

    def __enter__(self) -> ConfigWatcher:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _ensure_observer(self) -> None:
        """Receive events if we do not yet: at start, and again after the watch was lost or never made."""
        with self._lock:
            if self.stopping.is_set():
                return
            if self._observer is not None:
                from nvidia_device_plugin.base.fswatch import stop_watching, watching  # with the observer

                if watching(self._observer):
                    return
                log.warning("lost the filesystem watch on %s; re-creating it", self._source.describe())
                stop_watching(self._observer, 1.0)
                self._observer = None
            self._observer = self._start_observer()

    def _start_observer(self) -> BaseObserver | None:
        paths = self._source.watch_paths()
        if not paths:
            return None
        from nvidia_device_plugin.base.fswatch import watch_events

        where = ", ".join(str(p) for p in paths)
        try:
            observer = watch_events(paths, self._on_event, "config-watcher-events")
        except OSError as exc:
            self._failures.report(
                "events",
                f"cannot watch {where} ({exc.strerror or exc}); checking for changes every "
                f"{self._poll_interval:.0f}s until it can",
            )
            return None
        if self._failures.clear("events"):
            log.info("watching %s for events again", where)
        return observer

    def _on_event(self, event_type: str) -> None:
        if event_type not in _READ_ONLY_EVENTS:
            self._dirty.set()

    def run(self, stop: threading.Event) -> None:
        if self._defer_events:  # decided by the constructor: watch_events() may come before this thread runs
            self._events_wanted.wait(self._poll_interval)
            if stop.is_set():
                return
            self._look()  # the event watch, then a check against the fingerprint setup() took
        while not stop.is_set():
            woken = self._dirty.wait(self._poll_interval)
            if stop.is_set():
                break
            if woken:
                self._settle()
                if stop.is_set():
                    break
            self._look()

    def _look(self) -> None:
        """One look, which may fail for any reason without ending the thread (logged once per reason)."""
        try:
            self._ensure_observer()
            self._check()
        except Exception as exc:
            self._failures.report(
                "look",
                f"config watcher: looking at {self._source.describe()} failed ({type(exc).__name__}: {exc}); "
                "will look again",
                logging.ERROR,
                exc_info=True,
            )
            self.stopping.wait(min(self._poll_interval, 1.0))  # no busy loop if events keep coming
            return
        if self._failures.clear("look"):
            log.info("config watcher: looking at %s works again", self._source.describe())

    def _settle(self) -> None:
        """Wait until events have been quiet for the debounce period (bounded: a flood cannot starve us)."""
        for _ in range(20):
            self._dirty.clear()
            if self.stopping.wait(self._debounce) or not self._dirty.is_set():
                return
        self._dirty.clear()

    def _check(self) -> None:
        current = fingerprint(self._source)
        if current != self._last:
            self._last = current
            log.info("config changed: %s", _describe(current, self._source))
            try:
                self._on_change()
            except Exception:
                log.exception("config change handler failed")
        self._checks += 1

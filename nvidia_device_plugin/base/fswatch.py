"""Watching directories with watchdog (inotify on Linux): started, named and stopped in one place.

Every watch here is on a directory, never a file: kubelet replaces sockets and ConfigMap symlinks
by creating new entries, which a watch on the old file would never see.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

# watchdog 7's emitter logs this at ERROR when its read returns after its own stop (ours, or its
# directory's deletion, which `watching` notices) closed the inotify queue; the emitter just returns.
# Said at nearly every stop of a daemon with a config watch, it is no one's error to act on.
_STOP_RACE = "InotifyEmitter.queue_events() called when the thread is inactive"


class _WithoutStopRace(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != _STOP_RACE


logging.getLogger("watchdog.observers.inotify").addFilter(_WithoutStopRace())


EntryChanged = Callable[[Path, str], None]  # (path, "created" | "deleted" | "moved")


class _Entries(FileSystemEventHandler):
    def __init__(self, on_entry: EntryChanged) -> None:
        self._on_entry = on_entry

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("created", "deleted", "moved"):
            for path in (event.src_path, getattr(event, "dest_path", "")):
                if path:
                    self._on_entry(Path(str(path)), event.event_type)


class _Events(FileSystemEventHandler):
    def __init__(self, on_event: Callable[[str], None]) -> None:
        self._on_event = on_event

    def on_any_event(self, event: FileSystemEvent) -> None:
        self._on_event(event.event_type)


def watch_events(directories: Sequence[Path], on_event: Callable[[str], None], name: str) -> BaseObserver:
    """A started observer passing the type of every event on an entry of `directories` to `on_event`
    (watchdog's names: "created", "modified", "opened", "closed_no_write", ...)."""
    return watch_directories(directories, _Events(on_event), name)


def watch_entries(directory: Path, on_entry: EntryChanged, name: str) -> BaseObserver:
    """A started observer passing each entry created, deleted or moved in `directory` to `on_entry`."""
    return watch_directories([directory], _Entries(on_entry), name)


def watch_directories(
    directories: Sequence[Path], handler: FileSystemEventHandler, name: str
) -> BaseObserver:
    """A started observer calling `handler` for entries of `directories` (not recursive).

    Its threads are named after `name` (the observer, its emitters, watchdog's inotify reader), so a
    thread dump says whose they are. Raises OSError when a directory cannot be watched.
    """
    observer = Observer()
    observer.name = name
    reader = getattr(observer, "_inotify_fd", None)  # watchdog's inotify reader thread, unnamed otherwise
    if isinstance(reader, threading.Thread):
        reader.name = f"{name}-inotify"
    try:
        for directory in directories:
            observer.schedule(handler, str(directory), recursive=False)
        for i, emitter in enumerate(observer.emitters):
            emitter.name = f"{name}-emitter-{i}"
        observer.start()
    except OSError:
        stop_watching(observer, 1.0)
        raise
    return observer


def watching(observer: BaseObserver) -> bool:
    """Whether the observer still hears events: an emitter stops by itself when its directory is deleted."""
    return observer.is_alive() and all(emitter.is_alive() for emitter in list(observer.emitters))


def stop_watching(observer: BaseObserver, timeout: float = 5.0) -> None:
    observer.stop()  # also stops and joins the emitters and watchdog's inotify reader
    if observer.is_alive():
        observer.join(timeout)

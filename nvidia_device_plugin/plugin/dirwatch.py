"""The watch on the device-plugin directory through which the manager sees kubelet restart.

Kubelet announces a restart by deleting every socket in the directory and creating `kubelet.sock` anew;
the watch passes each created, deleted or moved entry on. A watch lost with its directory (deleted, then
made again) is made again by the next `keep()`, which then calls `on_gap`: whatever happened while nothing
watched was not seen. The registrar makes the first watch once its first registrations are done, so neither
watchdog's import nor its three threads stand between a start and kubelet seeing the resources.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from nvidia_device_plugin.base.logs import FailureLog

if TYPE_CHECKING:  # watchdog loads with the first watch, after the first registration (registrar.py)
    from watchdog.observers.api import BaseObserver

    from nvidia_device_plugin.base.fswatch import EntryChanged

log = logging.getLogger(__name__)

WATCH_FAILURE = "watch"  # the FailureLog key of the directory watch


class DirectoryWatch:
    """Keeps `directory` watched; failures go to `failures` under WATCH_FAILURE, once per reason."""

    def __init__(
        self, directory: Path, on_entry: EntryChanged, on_gap: Callable[[], None], failures: FailureLog
    ) -> None:
        self._directory = directory
        self._on_entry = on_entry
        self._on_gap = on_gap
        self._failures = failures
        self._observer: BaseObserver | None = None
        self._watched_once = False

    def keep(self) -> bool:
        """Make sure the directory is watched; True when it is. Never raises: a failure is reported."""
        from nvidia_device_plugin.base.fswatch import watch_entries, watching

        if self._observer is not None and watching(self._observer):
            return True
        self.stop()
        if not self._directory.is_dir():
            self._failures.report(
                WATCH_FAILURE, f"device-plugin directory {self._directory} does not exist; waiting for it"
            )
            return False
        try:
            self._observer = watch_entries(self._directory, self._on_entry, "plugin-dir-watch")
        except OSError as exc:
            self._failures.report(
                WATCH_FAILURE, f"cannot watch device-plugin directory {self._directory}: {exc}"
            )
            return False
        if self._failures.clear(WATCH_FAILURE):
            log.info("watching device-plugin directory %s again", self._directory)
        if self._watched_once:
            self._on_gap()
        self._watched_once = True
        return True

    def stop(self) -> None:
        if self._observer is not None:
            from nvidia_device_plugin.base.fswatch import stop_watching  # loaded with the observer

            stop_watching(self._observer)
            self._observer = None

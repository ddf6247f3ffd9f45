"""The config-manager's lifecycle: choose and link once, then follow the node's label until stopped.

State changes are logged once each (linked to another config, watch expired and re-listed, API failing for
a new reason, API back); a watch that the server simply ends after its timeout is reconnected quietly.
Failures never end the watching loop: the last good link stays in place, the reason is logged once, and the
loop backs off (1 s doubling to 30 s) before listing again.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.config.selection import (
    ConfigSelectionError,
    available_config_names,
    select_config,
)
from nvidia_device_plugin.configmanager.link import LinkError, point_link, write_empty_config
from nvidia_device_plugin.configmanager.nodewatch import NodeApiError, NodeLabelReader, WatchExpired
from nvidia_device_plugin.configmanager.processes import signal_processes
from nvidia_device_plugin.configmanager.settings import Settings

log = logging.getLogger(__name__)

_BACKOFF_FIRST_SECONDS = 1.0
_BACKOFF_MAX_SECONDS = 30.0
_PREFIX = "config-manager: "  # of every problem line


class ConfigManager:
    def __init__(self, settings: Settings, api_client: Any) -> None:
        self._settings = settings
        self._reader = NodeLabelReader(api_client, settings.node_name, settings.node_label)
        self._problems = FailureLog(log)  # by source ("api", "config"): each logged once until it clears

    def apply(self, label_value: str) -> bool:
        """Point CONFIG_FILE_DST at the config `label_value` selects; True when the link changed.

        Raises ConfigSelectionError or LinkError, leaving the previous link as it was.
        """
        s = self._settings
        selection = select_config(
            label_value,
            available_config_names(s.config_file_srcdir),
            s.default_config,
            s.fallback_strategies,
            s.node_label,
        )
        if selection.name is None:
            changed = write_empty_config(s.config_file_dst)
            chosen = "the empty config (built-in defaults)"
        else:
            target = s.config_file_srcdir / selection.name
            changed = point_link(s.config_file_dst, target)
            chosen = str(target)
        if changed:
            log.info(
                "%s=%s: %s now points at %s (%s)",
                s.node_label,
                label_value or "<unset>",
                s.config_file_dst,
                chosen,
                selection.reason,
            )
            if s.send_signal:
                signal_processes(s.process_to_signal, s.signal)
        return changed

    def run_once(self) -> int:
        """ONESHOT: link once; 0 on success, 1 with the reason logged otherwise (the pod then restarts)."""
        try:
            state = self._reader.list_state()
            self.apply(state.label_value or "")
        except (NodeApiError, ConfigSelectionError, LinkError) as exc:
            log.error("config-manager: %s", exc)
            return 1
        return 0

    def run(self, stop: threading.Event) -> None:
        """Link, then follow the label until `stop` is set. Never raises for API or config trouble."""
        s = self._settings
        log.info("following label %s of node %s", s.node_label, s.node_name)
        backoff = _BACKOFF_FIRST_SECONDS
        applied: str | None = None  # the label value last applied successfully
        while not stop.is_set():
            try:
                state = self._reader.list_state()
                self._recovered("api")
                applied = self._apply_if_new(state.label_value or "", applied)
                version = state.resource_version
                while not stop.is_set():
                    received = False
                    for update in self._reader.watch(version):
                        received = True
                        version = update.resource_version
                        if update.label_value is not None:
                            applied = self._apply_if_new(update.label_value, applied)
                        if stop.is_set():
                            break
                    if received:
                        backoff = _BACKOFF_FIRST_SECONDS
                    else:
                        # A real server ends a quiet watch after WATCH_SECONDS; one that ends it at once
                        # must not turn this loop into a busy one.
                        stop.wait(backoff)
                        backoff = min(backoff * 2, _BACKOFF_MAX_SECONDS)
            except WatchExpired as exc:
                log.info("watch of node %s expired (%s); listing it again", s.node_name, exc)
                continue
            except NodeApiError as exc:
                self._problem("api", str(exc))
            except Exception as exc:  # an odd API answer or a bug must not end the watching thread
                self._problem("api", f"unexpected {type(exc).__name__}: {exc}")
            stop.wait(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX_SECONDS)
        log.info("stopped following label %s of node %s", s.node_label, s.node_name)

    def _apply_if_new(self, label_value: str, applied: str | None) -> str | None:
        if label_value == applied:
            return applied
        try:
            self.apply(label_value)
        except (ConfigSelectionError, LinkError) as exc:
            # The link keeps its previous target; the next label change (or a restart) tries again.
            self._problem("config", f"{exc}; {self._settings.config_file_dst} left as it was")
            return applied
        self._recovered("config")
        return label_value

    def interrupt(self) -> None:
        """Make `run` notice its stop event now rather than at the next watch event (from another thread)."""
        self._reader.interrupt()

    def _problem(self, source: str, reason: str) -> None:
        self._problems.report(source, _PREFIX + reason, logging.ERROR)

    def _recovered(self, source: str) -> None:
        problem = self._problems.reason(source) or ""
        if self._problems.clear(source):
            log.info("%srecovered from: %s", _PREFIX, problem.removeprefix(_PREFIX))

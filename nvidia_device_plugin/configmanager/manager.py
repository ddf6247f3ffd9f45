"""The config-manager's lifecycle: choose and link once, then follow the node's label until stopped.

State changes are logged once each (linked to another config, watch expired and re-listed, API failing for
a new reason, API back); a watch that the server simply ends after its timeout is reconnected quietly.
API failures never end the watching loop: the last good link stays in place, the reason is logged once, and
the loop backs off (1 s doubling to 30 s) before listing again. A watch that ends early (the server closes
it after an event, or at once) is opened again only after client-go's backoff (0.8 s doubling to 30 s, with
jitter), reset once a watch has lived WATCH_HEALTHY_S: a server that ends every watch costs a request every
30-60 s, not a dozen a second.

What a config error does depends on who runs it. The `config-manager` command does what NVIDIA's does
(`exit_on_error`): a label naming no config, no config chosen, or SEND_SIGNAL with no process to signal
ends it with status 1, in ONESHOT and in the sidecar alike, and the pod restarts it. Inside the daemon
(`run --node-config-label`) such a label is logged and the previous link kept, until the next change.

ONESHOT is bounded as a whole (ONESHOT_TIMEOUT_S), beyond each request's own timeouts: an API server that
accepts the request and trickles or withholds its answer cannot hold the GPU pod in Init.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from nvidia_device_plugin.base.errors import DevicePluginError
from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.config.selection import (
    ConfigSelectionError,
    available_config_names,
    select_config,
)
from nvidia_device_plugin.configmanager import nodewatch
from nvidia_device_plugin.configmanager.link import LinkError, point_link, write_empty_config
from nvidia_device_plugin.configmanager.logtext import MAX_LOGGED_MESSAGE_CHARS, shown
from nvidia_device_plugin.configmanager.nodewatch import (
    NodeApiError,
    NodeLabelReader,
    RelistBackoff,
    WatchExpired,
)
from nvidia_device_plugin.configmanager.processes import signal_processes
from nvidia_device_plugin.configmanager.settings import Settings

log = logging.getLogger(__name__)

_BACKOFF_FIRST_SECONDS = 1.0
_BACKOFF_MAX_SECONDS = 30.0
_PREFIX = "config-manager: "  # of every problem line
# ONESHOT as a whole: one list (at most connect + answer timeouts, 15 s), the link and the signal.
ONESHOT_TIMEOUT_S = 30.0
# A watch that lived this long ended normally (the server's timeout): the next one opens at once.
WATCH_HEALTHY_S = 60.0
# Where NVIDIA's `empty` fallback points the link: the plugin reads /dev/null as an empty config.
EMPTY_CONFIG_TARGET = Path(os.devnull)


class NoProcessToSignal(DevicePluginError):
    """SEND_SIGNAL is set and no process is PROCESS_TO_SIGNAL (NVIDIA's config-manager fails then)."""


class _GiveUp(Exception):
    """Ends `run` with status 1 (exit_on_error), the reason already logged."""


class ConfigManager:
    def __init__(
        self,
        settings: Settings,
        api_client: Any,
        *,
        exit_on_error: bool = False,
        empty_target: Path | None = None,
        oneshot_timeout_s: float = ONESHOT_TIMEOUT_S,
        watch_healthy_s: float = WATCH_HEALTHY_S,
        relist_initial_s: float = nodewatch.RELIST_INITIAL_S,
    ) -> None:
        """`exit_on_error`: NVIDIA's behaviour (see the module's docstring). `empty_target`: what the link
        points at for the empty config; None writes an empty regular file instead. The three bounds after
        them default to the module's (and nodewatch's) constants."""
        self._settings = settings
        self._reader = NodeLabelReader(api_client, settings.node_name, settings.node_label, relist_initial_s)
        self._oneshot_timeout_s = oneshot_timeout_s
        self._watch_healthy_s = watch_healthy_s
        self._problems = FailureLog(log)  # by source ("api", "config"): each logged once until it clears
        self._exit_on_error = exit_on_error
        self._empty_target = empty_target
        self._reconnect = RelistBackoff()  # client-go's backoff, for watches that end early

    def apply(self, label_value: str) -> bool:
        """Point CONFIG_FILE_DST at the config `label_value` selects; True when the link changed.

        Raises ConfigSelectionError or LinkError, leaving the previous link as it was; NoProcessToSignal
        (only with `exit_on_error`) after changing it.
        """
        s = self._settings
        try:
            selection = select_config(
                label_value,
                available_config_names(s.config_file_srcdir),
                s.default_config,
                s.fallback_strategies,
                s.node_label,
            )
        except ConfigSelectionError as exc:
            if not label_value:
                raise
            raise ConfigSelectionError(str(exc).replace(label_value, shown(label_value))) from None
        if selection.name is not None:
            changed = point_link(s.config_file_dst, s.config_file_srcdir / selection.name)
            chosen = str(s.config_file_srcdir / selection.name)
        elif self._empty_target is not None:
            changed = point_link(s.config_file_dst, self._empty_target)
            chosen = f"{self._empty_target}, the empty config (built-in defaults)"
        else:
            changed = write_empty_config(s.config_file_dst)
            chosen = "the empty config (built-in defaults)"
        if changed:
            log.info(
                "%s=%s: %s now points at %s (%s)",
                s.node_label,
                shown(label_value) or "<unset>",
                s.config_file_dst,
                chosen,
                selection.reason,
            )
            if s.send_signal:
                self._signal()
        return changed

    def _signal(self) -> None:
        s = self._settings
        if not signal_processes(s.process_to_signal, s.signal) and self._exit_on_error:
            raise NoProcessToSignal(
                f"SEND_SIGNAL is set and no process named {s.process_to_signal} is there to signal "
                "(unset SEND_SIGNAL: this device plugin reloads the re-pointed config by itself)"
            )

    def run_once(self) -> int:
        """ONESHOT: link once; 0 on success, 1 with the reason logged otherwise (the pod then restarts).
        Bounded as a whole by `oneshot_timeout_s` (the module's docstring says why)."""
        s = self._settings
        outcome: list[int] = []
        worker = threading.Thread(
            target=lambda: outcome.append(self._link_once()), name="config-manager-oneshot", daemon=True
        )
        log.info(
            "reading label %s of node %s from the API (up to %.0f s: connecting %.0f s, its answer %.0f s)",
            s.node_label,
            s.node_name,
            self._oneshot_timeout_s,
            nodewatch.API_CONNECT_TIMEOUT_S,
            nodewatch.API_READ_TIMEOUT_S,
        )
        worker.start()
        worker.join(self._oneshot_timeout_s)
        if worker.is_alive():  # a daemon thread: the exit (or the daemon's failed start) ends it
            log.error(
                "%sno config linked: the API server did not answer the list of node %s within %.0f s; "
                "%s left as it was",
                _PREFIX,
                s.node_name,
                self._oneshot_timeout_s,
                s.config_file_dst,
            )
            return 1
        return outcome[0] if outcome else 1

    def _link_once(self) -> int:
        try:
            state = self._reader.list_state()
            self.apply(state.label_value or "")
        except (NodeApiError, ConfigSelectionError, LinkError, NoProcessToSignal) as exc:
            log.error("%s", shown(_PREFIX + str(exc), MAX_LOGGED_MESSAGE_CHARS))
            return 1
        except Exception as exc:  # an odd API answer or a bug: a clear line, not a traceback
            log.error("%sunexpected %s: %s", _PREFIX, type(exc).__name__, shown(str(exc)))
            return 1
        return 0

    def run(self, stop: threading.Event) -> int:
        """Link, then follow the label until `stop` is set (then 0). Never raises for API or config trouble;
        with `exit_on_error`, the first config or signal failure ends it with 1 (logged)."""
        s = self._settings
        log.info("following label %s of node %s", s.node_label, s.node_name)
        self._api_backoff = _BACKOFF_FIRST_SECONDS
        self._applied: str | None = None  # the label value last applied successfully
        while not stop.is_set():
            try:
                state = self._reader.list_state()
                self._recovered("api")
                self._apply_if_new(state.label_value or "")
                self._follow(stop, state.resource_version)
                continue
            except _GiveUp:
                return 1
            except WatchExpired as exc:
                log.info("watch of node %s expired (%s); listing it again", s.node_name, shown(str(exc)))
                continue
            except NodeApiError as exc:
                self._problem("api", str(exc))
            except Exception as exc:  # an odd API answer or a bug must not end the watching thread
                self._problem("api", f"unexpected {type(exc).__name__}: {exc}")
            stop.wait(self._api_backoff)
            self._api_backoff = min(self._api_backoff * 2, _BACKOFF_MAX_SECONDS)
        log.info("stopped following label %s of node %s", s.node_label, s.node_name)
        return 0

    def _follow(self, stop: threading.Event, version: str) -> None:
        """Watch from `version` until `stop`; raises what the watch raises."""
        while not stop.is_set():
            opened = time.monotonic()
            for update in self._reader.watch(version):
                self._api_backoff = _BACKOFF_FIRST_SECONDS
                version = update.resource_version
                if update.label_value is not None:
                    self._apply_if_new(update.label_value)
                if stop.is_set():
                    return
            lived = time.monotonic() - opened
            if lived >= self._watch_healthy_s:  # the server's timeout: reconnect at once
                self._reconnect.reset()
                continue
            # Ended early (after one event, or at once): client-go's backoff keeps this from becoming a loop.
            delay = self._reconnect.delay()
            log.debug(
                "watch of node %s ended after %.1fs; again in %.1fs", self._settings.node_name, lived, delay
            )
            stop.wait(delay)

    def _apply_if_new(self, label_value: str) -> None:
        if label_value == self._applied:
            return
        try:
            self.apply(label_value)
        except (ConfigSelectionError, LinkError, NoProcessToSignal) as exc:
            if self._exit_on_error:  # as NVIDIA's sidecar: exit 1, the pod restarts it
                log.error("%s", shown(_PREFIX + str(exc), MAX_LOGGED_MESSAGE_CHARS))
                raise _GiveUp from exc
            # The link keeps its previous target; the next label change (or a restart) tries again.
            self._problem("config", f"{exc}; {self._settings.config_file_dst} left as it was")
            return
        self._recovered("config")
        self._applied = label_value

    def interrupt(self) -> None:
        """Make `run` notice its stop event now rather than at the next watch event (from another thread)."""
        self._reader.interrupt()

    def _problem(self, source: str, reason: str) -> None:
        self._problems.report(source, shown(_PREFIX + reason, MAX_LOGGED_MESSAGE_CHARS), logging.ERROR)

    def _recovered(self, source: str) -> None:
        problem = self._problems.reason(source) or ""
        if self._problems.clear(source):
            log.info("%srecovered from: %s", _PREFIX, problem.removeprefix(_PREFIX))

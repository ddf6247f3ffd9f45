"""Runs one ResourceServer per resource and keeps each registered with kubelet.

Kubelet announces a restart by deleting every socket in the device-plugin directory and creating
`kubelet.sock` anew; the directory watch (dirwatch.py) turns both into re-serve + re-register work for
the registrar (registrar.py), the one thread that serves and registers. Kubelet's ListAndWatch stream of
a resource ending for any reason but our own stop (kubelet closed it, kubelet's disconnect race after a
quick re-registration, a kubelet that died) is re-register work too: kubelet never dials a plugin back, so
only a new Register makes it open a new stream. Repeated losses of short-lived streams back off.

health() says whether all of that works: the registrar runs, the directory is watched, every served
resource is registered, and none has gone without a kubelet stream for longer than the grace period.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.base.logs import FailureLog, RateLimitedLog
from nvidia_device_plugin.plugin.dirwatch import WATCH_FAILURE, DirectoryWatch
from nvidia_device_plugin.plugin.events import NO_PLUGIN_EVENTS, PluginEvents
from nvidia_device_plugin.plugin.registrar import (
    KUBELET,
    Registrar,
    RegistrarHooks,
    RegistrarSettings,
    socket_identity,
    waiting_for_kubelet,
)
from nvidia_device_plugin.plugin.registration import REGISTER_TIMEOUT_SECONDS
from nvidia_device_plugin.plugin.registration_state import Backoff, KubeletSocketId, RegistrationState
from nvidia_device_plugin.plugin.server import ResourceBackend, ResourceServer
from nvidia_device_plugin.plugin.streams import log as streams_log
from nvidia_device_plugin.plugin.unix_server import BindError

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
# How long a registered resource may go without kubelet's ListAndWatch stream before health() says so.
# Kubelet opens it within milliseconds of Register, and a lost one is registered again at once; this is
# for the case where that does not help (a Register timeout is 15 s). With the liveness probe's 6 x 10 s,
# the pod restarts about 90 s after kubelet stopped watching.
KUBELET_STREAM_GRACE_S = 30.0


@dataclass(frozen=True)
class ResourceSpec:
    """What the application wants served for one resource."""

    name: str
    socket_name: str
    backend: ResourceBackend


class PluginManager:
    """Serves resources, registers them, and re-serves/re-registers after kubelet restarts."""

    def __init__(
        self,
        plugin_dir: Path,
        kubelet_socket: str = KUBELET_SOCKET,
        events: PluginEvents = NO_PLUGIN_EVENTS,
        min_retry_seconds: float = 0.05,
        max_retry_seconds: float = 2.0,
        register_timeout_seconds: float = REGISTER_TIMEOUT_SECONDS,
        stream_grace_seconds: float = KUBELET_STREAM_GRACE_S,
        after_first_registrations: Callable[[], None] | None = None,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.kubelet_socket = plugin_dir / kubelet_socket
        self._events = events
        self._min_retry = min_retry_seconds
        self._max_retry = max_retry_seconds
        self._register_timeout = register_timeout_seconds
        self._stream_grace = stream_grace_seconds
        # Shared with the registrar, which the manager tells what happened through its verbs.
        self._state: RegistrationState[ResourceServer] = RegistrationState(
            Backoff(min_retry_seconds, max_retry_seconds)
        )
        self._failures = FailureLog(log)
        self._registrar: Registrar | None = None
        # Called once, on the registrar's thread, after the first round that leaves every served resource
        # (one at least) registered with kubelet; never when none is served or kubelet never accepts.
        self._after_first_registrations = after_first_registrations
        # The lines about other clients' ListAndWatch streams, limited per resource; a fresh one per start(),
        # as a worker runs once (the servers made meanwhile are all stopped and forgotten by stop()).
        self._stream_lines = RateLimitedLog(streams_log, name="plugin-stream-lines")
        self._watch = DirectoryWatch(
            plugin_dir, self._on_path_event, self._state.kubelet_restarted, self._failures
        )

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the registrar. Never raises for the directory: the registrar waits for it and says so, and
        watches it (its first round)."""
        try:
            self.plugin_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._failures.report(
                WATCH_FAILURE, f"cannot create device-plugin directory {self.plugin_dir}: {exc}"
            )
        if not self._stream_lines.started:
            self._stream_lines.start()
        self._start_registrar()
        if not self.kubelet_socket.exists():
            waiting_for_kubelet(self._failures, self.kubelet_socket)

    def _start_registrar(self) -> None:
        settings = RegistrarSettings(
            self.kubelet_socket, self._min_retry, self._max_retry, self._register_timeout
        )
        hooks = RegistrarHooks(
            self._watch.keep,
            self._bind,
            self._kubelet_restarted,
            self._failures,
            self._events,
            self._round_done,
        )
        self._registrar = Registrar(self._state, settings, hooks)
        self._registrar.start()

    def _round_done(self) -> None:
        after = self._after_first_registrations
        if after is not None and self._state.all_registered():
            self._after_first_registrations = None
            after()

    def stop(self) -> None:
        if self._registrar is not None:
            self._registrar.stop()
            self._registrar = None
        self._watch.stop()
        with self._state.serving():
            servers = self._state.clear()
            for server in servers:
                server.stop()
                log.info("stopped serving %s", server.resource_name)
        lines, self._stream_lines = (
            self._stream_lines,
            RateLimitedLog(streams_log, name="plugin-stream-lines"),
        )
        lines.stop()

    def health(self) -> str | None:
        """None when the registrar runs and every served resource is registered; else why not."""
        registrar = self._registrar
        if registrar is None or not registrar.alive:
            return "the plugin registrar is not running"
        if (problem := self._failures.reason(WATCH_FAILURE)) is not None:
            return problem
        missing, registered = self._state.unregistered()
        if not missing:
            return self._unwatched(
                [(n, s.streams.missing_since(), s.streams.unsure()) for n, s in registered.items()]
            )
        reasons = [
            self._failures.reason(f"bind:{n}") or self._failures.reason(f"register:{n}") for n in missing
        ]
        waiting = self._failures.reason(KUBELET)
        detail = next((r for r in reasons if r), None) or waiting or "registration in progress"
        return f"not registered with kubelet: {', '.join(missing)} ({detail})"

    def _unwatched(self, since: list[tuple[str, float | None, bool]]) -> str | None:
        """Registered resources without a stream known to be kubelet's for longer than the grace period
        (none open, or several opened while registering that cannot be told apart), said as such."""
        now = time.monotonic()
        late = [(n, unsure) for n, t, unsure in since if t is not None and now - t > self._stream_grace]
        if not late:
            return None
        names = ", ".join(n for n, _ in late)
        if any(unsure for _, unsure in late):
            return (
                f"cannot tell whether kubelet holds a ListAndWatch stream of {names} for over "
                f"{self._stream_grace:g}s although registered: another client opened streams while the "
                "plugin registered, so kubelet may not see its devices"
            )
        have = "has" if len(late) == 1 else "have"
        return (
            f"{names} {have} had no ListAndWatch stream from kubelet for over "
            f"{self._stream_grace:g}s although registered; kubelet does not see its devices"
        )

    # ---- what is served ---------------------------------------------------------------------

    def apply(self, specs: Mapping[str, ResourceSpec]) -> None:
        """Serve exactly `specs`: stop vanished resources, start new ones, push changes to the rest.

        A socket that cannot be bound now is logged and left to the registrar to retry; never raises for it.
        """
        with self._state.serving():
            gone = self._state.keep_only(specs)
            for server in gone:
                self._forget_failures(server.resource_name)
            for server in gone:
                server.stop()
                log.info("stopped serving %s: no longer advertised", server.resource_name)
            for name, spec in specs.items():
                self._apply_one(name, spec)
        registrar = self._registrar
        if registrar is not None and not registrar.alive and not registrar.stopping.is_set():
            log.error("the plugin registrar had stopped; starting it again")
            self._start_registrar()
        self._state.wake()

    def _apply_one(self, name: str, spec: ResourceSpec) -> None:
        existing = self._state.server(name)
        socket_path = self.plugin_dir / spec.socket_name
        if existing is not None and existing.socket_path == socket_path:
            existing.backend = spec.backend
            existing.notify()
            return
        if existing is not None:
            existing.stop()
            self._state.forget(name)
            self._forget_failures(name)
        server = ResourceServer(
            name,
            socket_path,
            spec.backend,
            events=self._events,
            on_kubelet_stream_end=self._stream_ended,
            stream_lines=self._stream_lines,
        )
        bound = self._bind(server)
        self._state.want(name, server, bound)
        if bound:
            log.info("serving %s on %s", name, socket_path)

    def _forget_failures(self, name: str) -> None:
        """Resource `name` is no longer served (the state forgot it): its failures are no longer said."""
        self._failures.clear(f"bind:{name}")
        self._failures.clear(f"register:{name}")

    def _bind(self, server: ResourceServer) -> bool:
        """Start `server`; a BindError is logged once per reason and answered False (retried later)."""
        try:
            server.start()
        except BindError as exc:
            self._failures.report(f"bind:{server.resource_name}", f"{exc}; will retry")
            return False
        return True

    def notify(self, resource: str | None = None) -> None:
        """Devices of `resource` (all when None) changed: push new ListAndWatch lists at once."""
        servers = [s for n, s in self._state.servers().items() if resource is None or n == resource]
        for server in servers:
            server.notify()

    def registered(self) -> set[str]:
        return self._state.registered()

    def served(self) -> set[str]:
        return self._state.served()

    def all_registered(self) -> bool:
        return self._state.all_registered()

    # ---- kubelet restarts -------------------------------------------------------------------

    def _on_path_event(self, path: Path, kind: str) -> None:
        if path == self.kubelet_socket and kind in ("created", "moved"):
            self._kubelet_restarted(f"kubelet socket {path} created", socket_identity(path))
            return
        if kind == "deleted":
            for name, server in self._state.servers().items():
                if server.socket_path == path and not server.socket_intact():
                    self._state.socket_lost(name, server)
            self._state.wake()

    def _stream_ended(self, server: ResourceServer, lived_s: float, lost: bool) -> None:
        """Kubelet's stream of `server` ended; when `lost`, it is registered again (after a delay, if any)."""
        name = server.resource_name
        delay = self._state.stream_ended(name, server, lived_s, lost)
        if delay is not None:
            log.info("registering %s again%s, so that kubelet opens a new stream", name, _after(delay))

    def _kubelet_restarted(self, why: str, kubelet_inode: KubeletSocketId | None = None) -> None:
        """A new kubelet; with `kubelet_inode` (of its socket), unless the registrar found it first."""
        if kubelet_inode is None:
            self._state.kubelet_restarted()
        elif not self._state.kubelet_socket_created(kubelet_inode):
            return
        log.info("%s: kubelet (re)started, re-registering all resources", why)
        self._events.kubelet_restarted()


def _after(delay: float) -> str:
    return f" in {delay:.2f}s (its streams keep ending)" if delay > 0 else ""

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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.plugin.dirwatch import WATCH_FAILURE, DirectoryWatch
from nvidia_device_plugin.plugin.events import NO_PLUGIN_EVENTS, PluginEvents
from nvidia_device_plugin.plugin.registrar import (
    KUBELET,
    Registrar,
    RegistrarHooks,
    RegistrarSettings,
    RegistrationState,
    waiting_for_kubelet,
)
from nvidia_device_plugin.plugin.registration import REGISTER_TIMEOUT_SECONDS
from nvidia_device_plugin.plugin.server import ResourceBackend, ResourceServer
from nvidia_device_plugin.plugin.unix_server import BindError

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
# How long a registered resource may go without kubelet's ListAndWatch stream before health() says so.
# Kubelet opens it within milliseconds of Register, and a lost one is registered again at once; this is
# for the case where that does not help (a Register timeout is 15 s). With the liveness probe's 6 x 10 s,
# the pod restarts about 90 s after kubelet stopped watching.
KUBELET_STREAM_GRACE_S = 30.0
# A kubelet stream that lived at least this long was a working registration: the next loss of it is
# answered at once; shorter ones in a row back off (min_retry doubling to max_retry).
_STABLE_STREAM_S = 10.0
# After kubelet's stream of a resource ended (our stop included), kubelet's client of that stream looks up
# the resource's current client and disconnects it; a registration landing before that look-up would be
# the one disconnected, and one still dialling would be left half-connected. Real kubelet looks within
# milliseconds; the same kubelet is given this long. Not after a kubelet restart: that kubelet is gone.
REGISTER_SETTLE_S = 0.5


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
        stream_grace_seconds: float | None = None,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.kubelet_socket = plugin_dir / kubelet_socket
        self._events = events
        self._min_retry = min_retry_seconds
        self._max_retry = max_retry_seconds
        self._register_timeout = register_timeout_seconds
        self._stream_grace = KUBELET_STREAM_GRACE_S if stream_grace_seconds is None else stream_grace_seconds
        # Shared with the registrar; the containers are aliased here for reading, the scalar is not.
        self._state = state = RegistrationState()
        self._servers, self._registered, self._pending = state.servers, state.registered, state.pending
        self._requests, self._rebind = state.requests, state.rebind
        self._not_before, self._losses = state.not_before, state.losses
        self._lock, self._serving, self._wake = state.lock, state.serving, state.wake
        self._failures = FailureLog(log)
        self._registrar: Registrar | None = None
        self._watch = DirectoryWatch(plugin_dir, self._on_path_event, self._reregister_all, self._failures)

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the registrar. Never raises for the directory: the registrar waits for it and says so."""
        try:
            self.plugin_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._failures.report(
                WATCH_FAILURE, f"cannot create device-plugin directory {self.plugin_dir}: {exc}"
            )
        self._watch.keep()
        self._start_registrar()
        if not self.kubelet_socket.exists():
            waiting_for_kubelet(self._failures, self.kubelet_socket)

    def _start_registrar(self) -> None:
        settings = RegistrarSettings(
            self.kubelet_socket, self._min_retry, self._max_retry, self._register_timeout, REGISTER_SETTLE_S
        )
        hooks = RegistrarHooks(
            self._watch.keep, self._bind, self._kubelet_restarted, self._failures, self._events
        )
        self._registrar = Registrar(self._state, settings, hooks)
        self._registrar.start()

    def stop(self) -> None:
        if self._registrar is not None:
            self._registrar.stop()
            self._registrar = None
        self._watch.stop()
        with self._serving:
            with self._lock:
                servers = list(self._servers.values())
                self._servers.clear()
                self._registered.clear()
                self._pending.clear()
                self._rebind.clear()
                self._not_before.clear()
            for server in servers:
                server.stop()
                log.info("stopped serving %s", server.resource_name)

    def health(self) -> str | None:
        """None when the registrar runs and every served resource is registered; else why not."""
        registrar = self._registrar
        if registrar is None or not registrar.alive:
            return "the plugin registrar is not running"
        if (problem := self._failures.reason(WATCH_FAILURE)) is not None:
            return problem
        with self._lock:
            missing = sorted(set(self._servers) - self._registered)
            registered = [(n, self._servers[n]) for n in sorted(self._registered) if n in self._servers]
        if not missing:
            return self._unwatched([(n, s.streams.missing_since()) for n, s in registered])
        reasons = [
            self._failures.reason(f"bind:{n}") or self._failures.reason(f"register:{n}") for n in missing
        ]
        waiting = self._failures.reason(KUBELET)
        detail = next((r for r in reasons if r), None) or waiting or "registration in progress"
        return f"not registered with kubelet: {', '.join(missing)} ({detail})"

    def _unwatched(self, since: list[tuple[str, float | None]]) -> str | None:
        """Registered resources without a kubelet stream for longer than the grace period, said as such."""
        now = time.monotonic()
        late = [n for n, t in since if t is not None and now - t > self._stream_grace]
        if not late:
            return None
        have = "has" if len(late) == 1 else "have"
        return (
            f"{', '.join(late)} {have} had no ListAndWatch stream from kubelet for over "
            f"{self._stream_grace:g}s although registered; kubelet does not see its devices"
        )

    # ---- what is served ---------------------------------------------------------------------

    def apply(self, specs: Mapping[str, ResourceSpec]) -> None:
        """Serve exactly `specs`: stop vanished resources, start new ones, push changes to the rest.

        A socket that cannot be bound now is logged and left to the registrar to retry; never raises for it.
        """
        with self._serving:
            with self._lock:
                gone = [self._servers.pop(name) for name in list(self._servers) if name not in specs]
                for server in gone:
                    self._forget(server.resource_name)
            for server in gone:
                server.stop()
                log.info("stopped serving %s: no longer advertised", server.resource_name)
            for name, spec in specs.items():
                self._apply_one(name, spec)
        registrar = self._registrar
        if registrar is not None and not registrar.alive and not registrar.stopping.is_set():
            log.error("the plugin registrar had stopped; starting it again")
            self._start_registrar()
        self._wake.set()

    def _apply_one(self, name: str, spec: ResourceSpec) -> None:
        with self._lock:
            existing = self._servers.get(name)
        socket_path = self.plugin_dir / spec.socket_name
        if existing is not None and existing.socket_path == socket_path:
            existing.backend = spec.backend
            existing.notify()
            return
        if existing is not None:
            existing.stop()
            with self._lock:
                self._forget(name)
        server = ResourceServer(
            name, socket_path, spec.backend, events=self._events, on_kubelet_stream_end=self._stream_ended
        )
        bound = self._bind(server)
        with self._lock:
            self._servers[name] = server
            self._pending[name] = next(self._requests)
            if not bound:
                self._rebind.add(name)
        if bound:
            log.info("serving %s on %s", name, socket_path)

    def _forget(self, name: str) -> None:
        """Under self._lock: drop every piece of state kept for resource `name`."""
        self._registered.discard(name)
        self._pending.pop(name, None)
        self._rebind.discard(name)
        self._not_before.pop(name, None)
        self._losses.pop(name, None)
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
        with self._lock:
            servers = [s for n, s in self._servers.items() if resource is None or n == resource]
        for server in servers:
            server.notify()

    def registered(self) -> set[str]:
        with self._lock:
            return set(self._registered)

    def served(self) -> set[str]:
        with self._lock:
            return set(self._servers)

    def all_registered(self) -> bool:
        with self._lock:
            return bool(self._servers) and self._registered == set(self._servers)

    # ---- kubelet restarts -------------------------------------------------------------------

    def _on_path_event(self, path: Path, kind: str) -> None:
        if path == self.kubelet_socket and kind in ("created", "moved"):
            self._kubelet_restarted(f"kubelet socket {path} created")
            return
        if kind == "deleted":
            with self._lock:
                for name, server in self._servers.items():
                    if server.socket_path == path and not server.socket_intact():
                        self._socket_lost(name)
            self._wake.set()

    def _socket_lost(self, name: str) -> None:
        """Under self._lock: resource `name` must be served anew on its socket, then registered again."""
        self._state.socket_lost(name)

    def _stream_ended(self, server: ResourceServer, lived_s: float, lost: bool) -> None:
        """Kubelet's stream of `server` ended. When `lost` (not by our stop), register again so that kubelet
        opens a new one: also while a registration is in flight (its request number changes, so its
        success is not taken for a live stream)."""
        name = server.resource_name
        with self._lock:
            self._state.stream_ended[name] = time.monotonic()
            if not lost or self._servers.get(name) is not server:
                return
            streak = 0 if lived_s >= _STABLE_STREAM_S else self._losses.get(name, 0) + 1
            self._losses[name] = streak
            delay = 0.0 if streak <= 1 else min(self._min_retry * 2 ** (streak - 2), self._max_retry)
            self._registered.discard(name)
            self._pending[name] = next(self._requests)
            self._not_before[name] = time.monotonic() + delay
        log.info("registering %s again%s, so that kubelet opens a new stream", name, _after(delay))
        self._wake.set()

    def _kubelet_restarted(self, why: str) -> None:
        log.info("%s: kubelet (re)started, re-registering all resources", why)
        self._events.kubelet_restarted()
        self._reregister_all()

    def _reregister_all(self) -> None:
        with self._lock:
            self._rebind.update(self._servers)
            self._pending.update({name: next(self._requests) for name in self._servers})
            self._registered.clear()
            self._state.kubelet_inode = None
            self._not_before.clear()  # a new kubelet: no reason to hold back
            self._state.stream_ended.clear()
        self._wake.set()


def _after(delay: float) -> str:
    return f" in {delay:.2f}s (its streams keep ending)" if delay > 0 else ""

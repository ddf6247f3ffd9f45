"""Runs one ResourceServer per resource and keeps each registered with kubelet.

Kubelet announces a restart by deleting every socket in the device-plugin directory and creating
`kubelet.sock` anew; the directory watch (dirwatch.py) turns both into re-serve + re-register work for
one registrar worker, so every state change is handled in one place, in order. Every few seconds the
registrar also checks the sockets itself, so an event the watch missed (or a watch lost with its
directory) costs seconds, not the node.

The registrar is supervised: a failure of any kind (binding a socket, registering, watching the
directory) is logged once per distinct reason and retried with backoff; the thread never ends before
stop(). health() says whether all of that is working.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.logs import FailureLog
from nvidia_device_plugin.plugin.dirwatch import WATCH_FAILURE, DirectoryWatch
from nvidia_device_plugin.plugin.events import NO_PLUGIN_EVENTS, PluginEvents
from nvidia_device_plugin.plugin.registration import (
    REGISTER_TIMEOUT_SECONDS,
    RegistrationError,
    register,
)
from nvidia_device_plugin.plugin.server import BindError, ResourceBackend, ResourceServer
from nvidia_device_plugin.workers import Worker

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
_KUBELET = "kubelet"  # FailureLog key of a missing kubelet socket
_REGISTRAR = "registrar"  # FailureLog key of an unexpected registrar failure


@dataclass(frozen=True)
class ResourceSpec:
    """What the application wants served for one resource."""

    name: str
    socket_name: str
    backend: ResourceBackend


class _Registrar(Worker):
    """The registrar thread ("plugin-registrar") of one start() of a manager."""

    def __init__(self, manager: PluginManager) -> None:
        super().__init__("plugin-registrar")
        self._manager = manager

    def run(self, stop: threading.Event) -> None:
        self._manager._supervise(stop)

    def wake(self) -> None:
        self._manager._wake.set()


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
    ) -> None:
        self.plugin_dir = plugin_dir
        self.kubelet_socket = plugin_dir / kubelet_socket
        self._events = events
        self._min_retry = min_retry_seconds
        self._max_retry = max_retry_seconds
        self._register_timeout = register_timeout_seconds
        self._servers: dict[str, ResourceServer] = {}
        self._registered: set[str] = set()
        # Resources to (re)register, each with the number of the request: a kubelet restart that lands
        # while a Register call is in flight must not be cleared by that call's success.
        self._pending: dict[str, int] = {}
        self._requests = itertools.count(1)
        self._rebind: set[str] = set()  # resources whose socket must be served anew first
        self._kubelet_inode: int | None = None  # of the kubelet.sock last registered with
        self._lock = threading.Lock()
        # Held while starting or stopping servers, so apply() and the registrar never race on one.
        self._serving = threading.Lock()
        self._wake = threading.Event()
        self._failures = FailureLog(log)
        self._registrar: _Registrar | None = None
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
            self._waiting_for_kubelet()

    def _start_registrar(self) -> None:
        self._registrar = _Registrar(self)
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
        if not missing:
            return None
        reasons = [
            self._failures.reason(f"bind:{n}") or self._failures.reason(f"register:{n}") for n in missing
        ]
        waiting = self._failures.reason(_KUBELET)
        detail = next((r for r in reasons if r), None) or waiting or "registration in progress"
        return f"not registered with kubelet: {', '.join(missing)} ({detail})"

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
        server = ResourceServer(name, socket_path, spec.backend, events=self._events)
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
        self._rebind.add(name)
        self._pending[name] = next(self._requests)
        self._registered.discard(name)

    def _kubelet_restarted(self, why: str) -> None:
        log.info("%s: kubelet (re)started, re-registering all resources", why)
        self._events.kubelet_restarted()
        self._reregister_all()

    def _reregister_all(self) -> None:
        with self._lock:
            self._rebind.update(self._servers)
            self._pending.update({name: next(self._requests) for name in self._servers})
            self._registered.clear()
            self._kubelet_inode = None
        self._wake.set()

    # ---- the registrar ----------------------------------------------------------------------

    def _supervise(self, stop: threading.Event) -> None:
        """The registrar thread: runs the loop until `stop`, and runs it again should it ever raise."""
        while not stop.is_set():
            try:
                self._registrar_loop(stop)
            except BaseException as exc:  # this thread must outlive any bug below it
                log.exception("the plugin registrar failed (%r); restarting it", exc)
                stop.wait(self._max_retry)

    def _registrar_loop(self, stop: threading.Event) -> None:
        delay = self._min_retry
        done = False
        while not stop.is_set():
            # Idle, the registrar still wakes now and then to check the sockets itself.
            self._wake.wait(timeout=self._max_retry if done else delay)
            self._wake.clear()
            if stop.is_set():
                return
            try:
                done = self._step(stop)
            except Exception as exc:
                self._failures.report(
                    _REGISTRAR, f"plugin registration failed unexpectedly, will retry: {exc!r}"
                )
                done = False
            else:
                self._failures.clear(_REGISTRAR)
            # Retry fast right after a kubelet restart, then back off so a dead kubelet costs nothing.
            delay = self._min_retry if done else min(delay * 2, self._max_retry)

    def _step(self, stop: threading.Event) -> bool:
        """One round of registrar work; True when nothing is left to retry."""
        watched = self._watch.keep()
        self._check_sockets()
        bound = self._rebind_sockets()
        registered = self._register_pending(stop)
        return watched and bound and registered

    def _check_sockets(self) -> None:
        """What the watch should have told us, checked directly: lost sockets, a new kubelet.sock."""
        with self._lock:
            servers = [(n, s) for n, s in self._servers.items() if n not in self._rebind]
            registered_with = self._kubelet_inode
        lost = [name for name, server in servers if not server.socket_intact()]
        if lost:
            with self._lock:
                for name in lost:
                    if name in self._servers:
                        self._socket_lost(name)
        if registered_with is not None and _inode(self.kubelet_socket) not in (None, registered_with):
            self._kubelet_restarted(f"kubelet socket {self.kubelet_socket} replaced")

    def _rebind_sockets(self) -> bool:
        """Serve every socket that was lost anew; True when all of them are bound."""
        with self._lock:
            todo = sorted(self._rebind)
        ok = True
        for name in todo:
            with self._serving:
                with self._lock:
                    server = self._servers.get(name)
                if server is None:
                    continue
                if not server.socket_intact():  # rebinding a live socket only opens a window for failures
                    server.stop(grace=0)
                    if not self._bind(server):
                        ok = False
                        continue
                    self._failures.clear(f"bind:{name}")
                    log.info("serving %s again on %s", name, server.socket_path)
                with self._lock:
                    self._rebind.discard(name)
        return ok

    def _register_pending(self, stop: threading.Event) -> bool:
        """Try every pending registration; True when none is left pending."""
        with self._lock:
            todo = [
                (n, self._servers[n], self._pending[n])
                for n in sorted(self._pending)
                if n in self._servers and n not in self._rebind
            ]
            unbound = bool(self._rebind)
        if not todo:
            return not unbound
        kubelet_inode = _inode(self.kubelet_socket)
        if kubelet_inode is None:
            self._waiting_for_kubelet()
            return False
        if self._failures.clear(_KUBELET):
            log.info("kubelet socket %s exists", self.kubelet_socket)
        failed = False
        for name, server, request in todo:
            try:
                register(self.kubelet_socket, name, server.socket_path.name, stop, self._register_timeout)
            except RegistrationError as exc:
                if stop.is_set():
                    return False
                self._failures.report(
                    f"register:{name}", f"registering {name} with kubelet failed, will retry: {exc}"
                )
                failed = True
                continue
            self._accepted(name, server, request, kubelet_inode)
        return not failed and not unbound

    def _accepted(self, name: str, server: ResourceServer, request: int, kubelet_inode: int) -> None:
        """Kubelet accepted request `request` for `name`: recorded, unless it is stale by now."""
        with self._lock:
            if self._servers.get(name) is not server:
                return  # replaced or stopped while we were registering
            if self._pending.get(name) != request:
                return  # kubelet restarted meanwhile: this registration went to the old one
            del self._pending[name]
            self._registered.add(name)
            self._kubelet_inode = kubelet_inode
        self._failures.clear(f"register:{name}")
        log.info("registered %s with kubelet (endpoint %s)", name, server.socket_path.name)
        self._events.registered(name)

    def _waiting_for_kubelet(self) -> None:
        """There is no kubelet socket (yet): said once, at INFO, until it appears."""
        self._failures.report(
            _KUBELET, f"waiting for kubelet: {self.kubelet_socket} does not exist yet", logging.INFO
        )


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None

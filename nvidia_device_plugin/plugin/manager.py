"""Runs one ResourceServer per resource and keeps each registered with kubelet.

Kubelet announces a restart by deleting every socket in the device-plugin directory and creating
`kubelet.sock` anew; a watchdog observer on that directory turns both into re-serve + re-register
work for one registrar thread, so every state change is handled in one place, in order.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers.api import BaseObserver

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.api.v1beta1 import api_pb2_grpc as pb_grpc
from nvidia_device_plugin.fswatch import stop_watching, watch_directories
from nvidia_device_plugin.plugin.server import ResourceBackend, ResourceServer, ServerHooks

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"


@dataclass(frozen=True)
class ResourceSpec:
    """What the application wants served for one resource."""

    name: str
    socket_name: str
    backend: ResourceBackend


@dataclass
class ManagerHooks:
    on_registered: list[Callable[[str], None]]
    on_kubelet_restart: list[Callable[[], None]]
    server: ServerHooks

    @classmethod
    def empty(cls) -> ManagerHooks:
        return cls(on_registered=[], on_kubelet_restart=[], server=ServerHooks())


class RegistrationError(Exception):
    pass


def register(kubelet_socket: Path, resource_name: str, endpoint: str, timeout: float = 2.0) -> None:
    """One Register call to kubelet; raises RegistrationError with kubelet's reason."""
    request = pb.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
    )
    with grpc.insecure_channel(f"unix:{kubelet_socket}") as channel:
        try:
            # No wait_for_ready: gRPC's reconnect backoff starts at a second; our own retry loop is faster.
            pb_grpc.RegistrationStub(channel).Register(request, timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise RegistrationError(f"{code.name if code else 'error'}: {details}") from exc


class _DirectoryEvents(FileSystemEventHandler):
    def __init__(self, manager: PluginManager) -> None:
        self._manager = manager

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("created", "deleted", "moved"):
            paths = [event.src_path, getattr(event, "dest_path", "")]
            for path in paths:
                if path:
                    self._manager._on_path_event(Path(str(path)), event.event_type)


class PluginManager:
    """Serves resources, registers them, and re-serves/re-registers after kubelet restarts."""

    def __init__(
        self,
        plugin_dir: Path,
        kubelet_socket: str = KUBELET_SOCKET,
        hooks: ManagerHooks | None = None,
        min_retry_seconds: float = 0.05,
        max_retry_seconds: float = 2.0,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.kubelet_socket = plugin_dir / kubelet_socket
        self.hooks = hooks or ManagerHooks.empty()
        self._min_retry = min_retry_seconds
        self._max_retry = max_retry_seconds
        self._servers: dict[str, ResourceServer] = {}
        self._registered: set[str] = set()
        # Resources to (re)register, each with the number of the request: a kubelet restart that lands
        # while a Register call is in flight must not be cleared by that call's success.
        self._pending: dict[str, int] = {}
        self._requests = itertools.count(1)
        self._rebind: set[str] = set()  # resources whose socket must be served anew first
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last_failure: dict[str, str] = {}
        self._thread: threading.Thread | None = None
        self._observer: BaseObserver | None = None

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._observer = watch_directories([self.plugin_dir], _DirectoryEvents(self), "plugin-dir-watch")
        self._thread = threading.Thread(target=self._run, name="plugin-registrar", daemon=True)
        self._thread.start()
        if not self.kubelet_socket.exists():
            log.info("waiting for kubelet: %s does not exist yet", self.kubelet_socket)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._observer is not None:
            stop_watching(self._observer)
            self._observer = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            servers = list(self._servers.values())
            self._servers.clear()
            self._registered.clear()
        for server in servers:
            server.stop()
            log.info("stopped serving %s", server.resource_name)

    # ---- what is served ---------------------------------------------------------------------

    def apply(self, specs: Mapping[str, ResourceSpec]) -> None:
        """Serve exactly `specs`: stop vanished resources, start new ones, push changes to the rest."""
        with self._lock:
            gone = [self._servers.pop(name) for name in list(self._servers) if name not in specs]
            for server in gone:
                self._registered.discard(server.resource_name)
                self._pending.pop(server.resource_name, None)
        for server in gone:
            server.stop()
            log.info("stopped serving %s: no longer advertised", server.resource_name)
        for name, spec in specs.items():
            with self._lock:
                existing = self._servers.get(name)
            socket_path = self.plugin_dir / spec.socket_name
            if existing is not None and existing.socket_path == socket_path:
                existing.backend = spec.backend
                existing.notify()
                continue
            if existing is not None:
                existing.stop()
            server = ResourceServer(name, socket_path, spec.backend, hooks=self.hooks.server)
            server.start()
            log.info("serving %s on %s", name, socket_path)
            with self._lock:
                self._servers[name] = server
                self._pending[name] = next(self._requests)
        self._wake.set()

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
            log.info("kubelet socket %s created: kubelet (re)started, re-registering all resources", path)
            for hook in self.hooks.on_kubelet_restart:
                hook()
            with self._lock:
                self._rebind.update(self._servers)
                self._pending.update({name: next(self._requests) for name in self._servers})
                self._registered.clear()
            self._wake.set()
            return
        if kind == "deleted":
            with self._lock:
                for name, server in self._servers.items():
                    if server.socket_path == path and not server.socket_intact():
                        self._rebind.add(name)
                        self._pending[name] = next(self._requests)
                        self._registered.discard(name)
            self._wake.set()

    def _run(self) -> None:
        delay = self._min_retry
        while not self._stop.is_set():
            with self._lock:
                busy = bool(self._pending or self._rebind)
            self._wake.wait(timeout=delay if busy else None)
            self._wake.clear()
            if self._stop.is_set():
                return
            self._rebind_sockets()
            done = self._register_pending()
            # Retry fast right after a kubelet restart, then back off so a dead kubelet costs nothing.
            delay = self._min_retry if done else min(delay * 2, self._max_retry)

    def _rebind_sockets(self) -> None:
        with self._lock:
            todo = [self._servers[n] for n in self._rebind if n in self._servers]
            self._rebind.clear()
        for server in todo:
            if server.socket_intact():
                continue  # rebinding a live socket would only open a window where Allocate fails
            server.stop(grace=0)
            server.start()
            log.info("serving %s again on %s", server.resource_name, server.socket_path)

    def _register_pending(self) -> bool:
        """Try every pending registration; True when none is left pending."""
        with self._lock:
            todo = [
                (n, self._servers[n], self._pending[n]) for n in sorted(self._pending) if n in self._servers
            ]
        if not todo:
            return True
        if not self.kubelet_socket.exists():
            return False
        failed = False
        for name, server, request in todo:
            try:
                register(self.kubelet_socket, name, server.socket_path.name)
            except RegistrationError as exc:
                reason = str(exc)
                if self._last_failure.get(name) != reason:
                    log.warning("registering %s with kubelet failed, will retry: %s", name, reason)
                    self._last_failure[name] = reason
                failed = True
                continue
            with self._lock:
                if self._servers.get(name) is not server:
                    continue  # replaced or stopped while we were registering
                if self._pending.get(name) != request:
                    continue  # kubelet restarted meanwhile: this registration went to the old one
                del self._pending[name]
                self._registered.add(name)
            self._last_failure.pop(name, None)
            log.info("registered %s with kubelet (endpoint %s)", name, server.socket_path.name)
            for hook in self.hooks.on_registered:
                hook(name)
        return not failed

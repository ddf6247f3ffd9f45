"""The registrar: the one thread ("plugin-registrar") that serves lost sockets anew and registers them.

It is the PluginManager's own worker: the two share one RegistrationState (under its lock), and the
registrar calls back into the manager only through the hooks it is given. Every state change (a kubelet
restart, a lost socket, kubelet's stream of a resource ending) becomes re-serve + re-register work here,
handled in one place, in order. Every few seconds it also checks the sockets itself, so an event the
directory watch missed costs seconds, not the node.

It is supervised: a failure of any kind (binding a socket, registering, watching the directory) is logged
once per distinct reason and retried with backoff; the thread never ends before stop(). A resource is
registered only while its socket is the one its server listens on: a Register naming an endpoint kubelet
cannot dial would replace, then drop, the live registration.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.base.workers import Worker
from nvidia_device_plugin.plugin.events import PluginEvents
from nvidia_device_plugin.plugin.registration import RegistrationError, register
from nvidia_device_plugin.plugin.server import ResourceServer

# The registrar speaks for the manager: its lines come from the manager's logger, as they always have.
log = logging.getLogger("nvidia_device_plugin.plugin.manager")

KUBELET = "kubelet"  # FailureLog key of a missing kubelet socket
_REGISTRAR = "registrar"  # FailureLog key of an unexpected registrar failure


def inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


def waiting_for_kubelet(failures: FailureLog, kubelet_socket: Path) -> None:
    """There is no kubelet socket (yet): said once, at INFO, until it appears."""
    failures.report(KUBELET, f"waiting for kubelet: {kubelet_socket} does not exist yet", logging.INFO)


@dataclass
class RegistrationState:
    """What the manager and its registrar share; every field is read and written under `lock`."""

    servers: dict[str, ResourceServer] = field(default_factory=dict)
    registered: set[str] = field(default_factory=set)
    # Resources to (re)register, each with the number of the request: a kubelet restart that lands while
    # a Register call is in flight must not be cleared by that call's success.
    pending: dict[str, int] = field(default_factory=dict)
    requests: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    rebind: set[str] = field(default_factory=set)  # resources whose socket must be served anew first
    not_before: dict[str, float] = field(default_factory=dict)  # deferred (after quick stream losses)
    losses: dict[str, int] = field(default_factory=dict)  # kubelet streams lost in a row, short-lived
    # When each resource's last kubelet stream ended (by our stop too); kept while the same kubelet runs.
    stream_ended: dict[str, float] = field(default_factory=dict)
    kubelet_inode: int | None = None  # of the kubelet.sock last registered with
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Held while starting or stopping servers, so apply() and the registrar never race on one.
    serving: threading.Lock = field(default_factory=threading.Lock)
    wake: threading.Event = field(default_factory=threading.Event)

    def socket_lost(self, name: str) -> None:
        """Under `lock`: resource `name` must be served anew on its socket, then registered again."""
        self.rebind.add(name)
        self.pending[name] = next(self.requests)
        self.registered.discard(name)


@dataclass(frozen=True)
class RegistrarSettings:
    kubelet_socket: Path
    min_retry_s: float
    max_retry_s: float
    register_timeout_s: float
    settle_s: float  # after a resource's kubelet stream ended, before it is registered again


@dataclass(frozen=True)
class RegistrarHooks:
    """What the registrar asks of its manager."""

    keep_watching: Callable[[], bool]  # the directory watch is in place (made again when lost)
    bind: Callable[[ResourceServer], bool]  # start a server; False (failure reported) when it cannot
    kubelet_restarted: Callable[[str], None]
    failures: FailureLog
    events: PluginEvents


class Registrar(Worker):
    """The registrar thread of one start() of a manager."""

    def __init__(self, state: RegistrationState, settings: RegistrarSettings, hooks: RegistrarHooks) -> None:
        super().__init__("plugin-registrar")
        self._s = state
        self._c = settings
        self._h = hooks
        self._deferred_until: float | None = None  # the earliest deferred registration is due then

    def run(self, stop: threading.Event) -> None:
        """Runs the loop until `stop`, and runs it again should it ever raise."""
        while not stop.is_set():
            try:
                self._loop(stop)
            except BaseException as exc:  # this thread must outlive any bug below it
                log.exception("the plugin registrar failed (%r); restarting it", exc)
                stop.wait(self._c.max_retry_s)

    def wake(self) -> None:
        self._s.wake.set()

    def _loop(self, stop: threading.Event) -> None:
        delay = self._c.min_retry_s
        done = False
        while not stop.is_set():
            # Idle, the registrar still wakes now and then to check the sockets itself.
            timeout = self._c.max_retry_s if done else delay
            if self._deferred_until is not None:
                timeout = min(timeout, max(0.0, self._deferred_until - time.monotonic()))
            self._s.wake.wait(timeout=timeout)
            self._s.wake.clear()
            if stop.is_set():
                return
            try:
                done = self._step(stop)
            except Exception as exc:
                self._h.failures.report(
                    _REGISTRAR, f"plugin registration failed unexpectedly, will retry: {exc!r}"
                )
                done = False
            else:
                self._h.failures.clear(_REGISTRAR)
            # Retry fast right after a kubelet restart, then back off so a dead kubelet costs nothing.
            delay = self._c.min_retry_s if done else min(delay * 2, self._c.max_retry_s)

    def _step(self, stop: threading.Event) -> bool:
        """One round of registrar work; True when nothing is left to retry."""
        watched = self._h.keep_watching()
        self._check_sockets()
        bound = self._rebind_sockets()
        registered = self._register_pending(stop)
        return watched and bound and registered

    def _check_sockets(self) -> None:
        """What the watch should have told us, checked directly: lost sockets, a new kubelet.sock."""
        with self._s.lock:
            servers = [(n, s) for n, s in self._s.servers.items() if n not in self._s.rebind]
            registered_with = self._s.kubelet_inode
        lost = [name for name, server in servers if not server.socket_intact()]
        if lost:
            with self._s.lock:
                for name in lost:
                    if name in self._s.servers:
                        self._s.socket_lost(name)
        if registered_with is not None and inode(self._c.kubelet_socket) not in (None, registered_with):
            self._h.kubelet_restarted(f"kubelet socket {self._c.kubelet_socket} replaced")

    def _rebind_sockets(self) -> bool:
        """Serve every socket that was lost anew; True when all of them are bound."""
        with self._s.lock:
            todo = sorted(self._s.rebind)
        ok = True
        for name in todo:
            with self._s.serving:
                with self._s.lock:
                    server = self._s.servers.get(name)
                if server is None:
                    continue
                if not server.socket_intact():  # rebinding a live socket only opens a window for failures
                    server.stop(grace=0)
                    if not self._h.bind(server):
                        ok = False
                        continue
                    self._h.failures.clear(f"bind:{name}")
                    log.info("serving %s again on %s", name, server.socket_path)
                with self._s.lock:
                    self._s.rebind.discard(name)
        return ok

    def _register_pending(self, stop: threading.Event) -> bool:
        """Try every pending registration that is due; True when none is left pending."""
        now = time.monotonic()
        current = inode(self._c.kubelet_socket)
        with self._s.lock:
            # Another kubelet than the one registered with: the old one's clients look up nothing more.
            fresh = self._s.kubelet_inode is None or current != self._s.kubelet_inode
            waiting = [n for n in sorted(self._s.pending) if n in self._s.servers and n not in self._s.rebind]
            due = {n: self._due(n, fresh) for n in waiting}
            todo = [(n, self._s.servers[n], self._s.pending[n]) for n in waiting if due[n] <= now]
            left = bool(self._s.rebind)
        later = [t for t in due.values() if t > now]
        self._deferred_until = min(later) if later else None
        if not todo:
            return not left
        kubelet_inode = current
        if kubelet_inode is None:
            waiting_for_kubelet(self._h.failures, self._c.kubelet_socket)
            return False
        if self._h.failures.clear(KUBELET):
            log.info("kubelet socket %s exists", self._c.kubelet_socket)
        failed = False
        for name, server, request in todo:
            if not self._register_one(stop, name, server):
                if stop.is_set():
                    return False
                failed = True
                continue
            self._accepted(name, server, request, kubelet_inode)
        return not failed and not left

    def _due(self, name: str, fresh_kubelet: bool) -> float:
        """Under the lock: when `name` may be registered. Not before kubelet's client of its previous
        stream has looked up whom to disconnect (kubelet's disconnect race), nor before a backoff ends."""
        ended = None if fresh_kubelet else self._s.stream_ended.get(name)
        settled = 0.0 if ended is None else ended + self._c.settle_s
        return max(self._s.not_before.get(name, 0.0), settled)

    def _register_one(self, stop: threading.Event, name: str, server: ResourceServer) -> bool:
        if not server.socket_intact():  # never name an endpoint kubelet cannot dial
            with self._s.lock:
                if self._s.servers.get(name) is server:
                    self._s.socket_lost(name)
            return False
        server.streams.expect_kubelet()
        try:
            register(self._c.kubelet_socket, name, server.socket_path.name, stop, self._c.register_timeout_s)
        except RegistrationError as exc:
            server.streams.expect_kubelet(False)
            if not stop.is_set():
                self._h.failures.report(
                    f"register:{name}", f"registering {name} with kubelet failed, will retry: {exc}"
                )
            return False
        return True

    def _accepted(self, name: str, server: ResourceServer, request: int, kubelet_inode: int) -> None:
        """Kubelet accepted request `request` for `name`: recorded, unless it is stale by now."""
        with self._s.lock:
            if self._s.servers.get(name) is not server:
                return  # replaced or stopped while we were registering
            if self._s.pending.get(name) != request:
                return  # kubelet restarted (or dropped the stream) meanwhile: registered again next
            del self._s.pending[name]
            self._s.not_before.pop(name, None)
            self._s.registered.add(name)
            self._s.kubelet_inode = kubelet_inode
        self._h.failures.clear(f"register:{name}")
        log.info("registered %s with kubelet (endpoint %s)", name, server.socket_path.name)
        self._h.events.registered(name)

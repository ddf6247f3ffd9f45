"""The registrar: the one thread ("plugin-registrar") that serves lost sockets anew and registers them.

It is the PluginManager's own worker: the two share one RegistrationState (registration_state.py), and the
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

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.base.workers import Worker
from nvidia_device_plugin.plugin.events import PluginEvents
from nvidia_device_plugin.plugin.registration import RegistrationError, register
from nvidia_device_plugin.plugin.registration_state import KubeletSocketId, Registration, RegistrationState
from nvidia_device_plugin.plugin.server import ResourceServer

# The registrar speaks for the manager: its lines come from the manager's logger, as they always have.
log = logging.getLogger("nvidia_device_plugin.plugin.manager")

KUBELET = "kubelet"  # FailureLog key of a missing kubelet socket
_REGISTRAR = "registrar"  # FailureLog key of an unexpected registrar failure


def socket_identity(path: Path) -> KubeletSocketId | None:
    """Which socket is at `path` now (see KubeletSocketId); None when there is none."""
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_ino, status.st_ctime_ns


def waiting_for_kubelet(failures: FailureLog, kubelet_socket: Path) -> None:
    """There is no kubelet socket (yet): said once, at INFO, until it appears."""
    failures.report(KUBELET, f"waiting for kubelet: {kubelet_socket} does not exist yet", logging.INFO)


@dataclass(frozen=True)
class RegistrarSettings:
    """Where kubelet is and how the registrar retries."""

    kubelet_socket: Path
    min_retry_s: float
    max_retry_s: float
    register_timeout_s: float


@dataclass(frozen=True)
class RegistrarHooks:
    """What the registrar asks of its manager."""

    keep_watching: Callable[[], bool]  # the directory watch is in place (made again when lost)
    bind: Callable[[ResourceServer], bool]  # start a server; False (failure reported) when it cannot
    kubelet_restarted: Callable[[str], None]
    failures: FailureLog
    events: PluginEvents
    round_done: Callable[[], None]  # after each round of work, whatever came of it


class Registrar(Worker):
    """The registrar thread of one start() of a manager."""

    def __init__(
        self, state: RegistrationState[ResourceServer], settings: RegistrarSettings, hooks: RegistrarHooks
    ) -> None:
        super().__init__("plugin-registrar")
        self._s = state
        self._c = settings
        self._h = hooks
        self._watched = False  # the directory watch was in place after the last round

    def run(self, stop: threading.Event) -> None:
        """Runs the loop until `stop`, and runs it again should it ever raise."""
        while not stop.is_set():
            try:
                self._loop(stop)
            except BaseException as exc:  # this thread must outlive any bug below it
                log.exception("the plugin registrar failed (%r); restarting it", exc)
                stop.wait(self._c.max_retry_s)

    def wake(self) -> None:
        self._s.wake()

    def _loop(self, stop: threading.Event) -> None:
        delay = self._c.min_retry_s
        done = False
        while not stop.is_set():
            # Idle, the registrar still wakes now and then to check the sockets itself.
            self._s.wait(self._c.max_retry_s if done else delay)
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
            self._h.round_done()
            # Retry fast right after a kubelet restart, then back off so a dead kubelet costs nothing.
            delay = self._c.min_retry_s if done else min(delay * 2, self._c.max_retry_s)

    def _step(self, stop: threading.Event) -> bool:
        """One round of registrar work; True when nothing is left to retry. The directory watch is made
        (or checked) after the registrations: at start, kubelet sees the resources without waiting for it,
        and what it would have told in between, _check_sockets finds once it is in place."""
        self._check_sockets()
        bound = self._rebind_sockets()
        registered = self._register_pending(stop)
        watched = self._h.keep_watching()
        if watched and not self._watched:  # made this round: a kubelet restart before it is seen now, not
            self._check_sockets()  # at the next periodic check (a watch made again calls its on_gap)
        self._watched = watched
        return watched and bound and registered

    def _check_sockets(self) -> None:
        """What the watch should have told us, checked directly: lost sockets, a new kubelet.sock."""
        servers, registered_with = self._s.to_check()
        for name, server in servers.items():
            if not server.socket_intact():
                self._s.socket_lost(name)
        if registered_with is not None and socket_identity(self._c.kubelet_socket) not in (
            None,
            registered_with,
        ):
            self._h.kubelet_restarted(f"kubelet socket {self._c.kubelet_socket} replaced")

    def _rebind_sockets(self) -> bool:
        """Serve every socket that was lost anew; True when all of them are bound."""
        ok = True
        for name in self._s.to_rebind():
            with self._s.serving():
                server = self._s.server(name)
                if server is None:
                    continue
                if not server.socket_intact():  # rebinding a live socket only opens a window for failures
                    server.stop(grace=0)
                    if not self._h.bind(server):
                        ok = False
                        continue
                    self._h.failures.clear(f"bind:{name}")
                    log.info("serving %s again on %s", name, server.socket_path)
                self._s.rebound(name)
        return ok

    def _register_pending(self, stop: threading.Event) -> bool:
        """Try every pending registration that is due; True when none is left pending."""
        kubelet_inode = socket_identity(self._c.kubelet_socket)
        due = self._s.due(kubelet_inode)
        if not due.now:
            return not due.rebinding
        if kubelet_inode is None:
            waiting_for_kubelet(self._h.failures, self._c.kubelet_socket)
            return False
        if self._h.failures.clear(KUBELET):
            log.info("kubelet socket %s exists", self._c.kubelet_socket)
        failed = False
        for registration in due.now:
            if not self._register_one(stop, registration.name, registration.server):
                if stop.is_set():
                    return False
                failed = True
                continue
            self._accepted(registration, kubelet_inode)
        return not failed and not due.rebinding

    def _register_one(self, stop: threading.Event, name: str, server: ResourceServer) -> bool:
        if not server.socket_intact():  # never name an endpoint kubelet cannot dial
            self._s.socket_lost(name, server)
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
        server.streams.registered()
        return True

    def _accepted(self, registration: Registration[ResourceServer], kubelet_inode: KubeletSocketId) -> None:
        """Kubelet accepted `registration`: recorded and said, unless it is stale by now."""
        if not self._s.accepted(registration, kubelet_inode):
            return
        name = registration.name
        self._h.failures.clear(f"register:{name}")
        log.info("registered %s with kubelet (endpoint %s)", name, registration.server.socket_path.name)
        self._h.events.registered(name)

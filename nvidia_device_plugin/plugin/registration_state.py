"""What must be served and registered with kubelet, and when: the one state the manager and registrar share.

Every change of the world is one verb here (`want`, `socket_lost`, `stream_ended`, `kubelet_restarted`,
...), and the registrar asks `due` what to register now. A kubelet stream's end and a kubelet restart wake
the registrar themselves; after `want` and `socket_lost` the caller decides when to (`wake`), as the
registrar finding a lost socket goes on to serve it anew without waking itself.

The fields are private and read and written under one lock, so no caller can leave them half-updated. The
state knows nothing of sockets or gRPC: a server is an opaque handle, compared by identity, and the clock is
injectable, so its rules are tested in milliseconds (tests/plugin/test_registration_state.py).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

S = TypeVar("S")  # a resource server, only ever compared by identity here

# A kubelet stream that lived at least this long was a working registration: the next loss of it is
# answered at once; shorter ones in a row back off (min_retry doubling to max_retry).
STABLE_STREAM_S = 10.0
# After kubelet's stream of a resource ended (our stop included), kubelet's client of that stream looks up
# the resource's current client and disconnects it; a registration landing before that look-up would be
# the one disconnected, and one still dialling would be left half-connected. Real kubelet looks within
# milliseconds; the same kubelet is given this long. Not after a kubelet restart: that kubelet is gone.
REGISTER_SETTLE_S = 0.5


# Which kubelet.sock: its inode and the time it was made (st_ctime_ns). A restarted kubelet's new socket
# often gets the old one's inode back (tmpfs reuses them at once), so the inode alone cannot tell them apart.
KubeletSocketId = tuple[int, int]


@dataclass(frozen=True)
class Backoff:
    """How registration after lost kubelet streams is paced."""

    min_retry_s: float = 0.05
    max_retry_s: float = 2.0
    stable_stream_s: float = STABLE_STREAM_S
    settle_s: float = REGISTER_SETTLE_S  # after a resource's kubelet stream ended, before registering again


@dataclass(frozen=True)
class Registration(Generic[S]):
    """One Register to send now: `request` is handed back to `accepted` once kubelet took it."""

    name: str
    server: S
    request: int


@dataclass(frozen=True)
class Due(Generic[S]):
    """What `due` found: the registrations to send now, and whether sockets are still to be served anew."""

    now: list[Registration[S]]
    rebinding: bool

    @property
    def all_done(self) -> bool:
        return not self.now and not self.rebinding


class RegistrationState(Generic[S]):
    """The resources served, which are registered, which must be served anew or registered, and when."""

    def __init__(self, backoff: Backoff = Backoff(), clock: Callable[[], float] = time.monotonic) -> None:
        self._backoff = backoff
        self._clock = clock
        self._lock = threading.Lock()
        # Held while starting or stopping servers, so apply() and the registrar never race on one.
        self._serving = threading.Lock()
        self._wake = threading.Event()
        self._servers: dict[str, S] = {}
        self._registered: set[str] = set()
        # Resources to (re)register, each with the number of the request: a kubelet restart that lands while
        # a Register call is in flight must not be cleared by that call's success.
        self._pending: dict[str, int] = {}
        self._requests = itertools.count(1)
        self._rebind: set[str] = set()  # resources whose socket must be served anew first
        self._not_before: dict[str, float] = {}  # deferred (after quick stream losses)
        self._losses: dict[str, int] = {}  # kubelet streams lost in a row, short-lived
        # When each resource's last kubelet stream ended (by our stop too); kept while the same kubelet runs.
        self._stream_ended: dict[str, float] = {}
        self._kubelet_inode: KubeletSocketId | None = None  # of the kubelet.sock last registered with
        # When a kubelet restart was last taken in: a stream opened before then was the gone kubelet's.
        self._restarted_at: float | None = None
        self._registering_with: KubeletSocketId | None = None  # the kubelet.sock last registered to
        self._next_due: float | None = None  # the earliest deferred registration is due then

    # ---- what the manager says -----------------------------------------------------------------

    def want(self, name: str, server: S, bound: bool) -> None:
        """Serve `name` by `server` (replacing any other) and register it; `bound`: its socket is served."""
        with self._lock:
            self._servers[name] = server
            self._pending[name] = next(self._requests)
            if not bound:
                self._rebind.add(name)

    def forget(self, name: str) -> S | None:
        """`name` is no longer served: every piece of state kept for it goes; its server is returned."""
        with self._lock:
            return self._forget(name)

    def keep_only(self, names: Collection[str]) -> list[S]:
        """Forget every resource but `names`; the servers of the others are returned, to be stopped."""
        with self._lock:
            gone = [self._forget(name) for name in list(self._servers) if name not in names]
        return [server for server in gone if server is not None]

    def clear(self) -> list[S]:
        """Nothing is served any more (the manager stops); every server is returned, to be stopped."""
        with self._lock:
            servers = list(self._servers.values())
            self._servers.clear()
            self._registered.clear()
            self._pending.clear()
            self._rebind.clear()
            self._not_before.clear()
        return servers

    def socket_lost(self, name: str, server: S | None = None) -> None:
        """`name`'s socket must be served anew, then registered again (only while served by `server`)."""
        with self._lock:
            current = self._servers.get(name)
            if current is None or (server is not None and current is not server):
                return
            self._socket_lost(name)

    def stream_ended(self, name: str, server: S, lived_s: float, lost: bool) -> float | None:
        """Kubelet's stream of `server` ended. When `lost` (not by our stop), register again so that kubelet
        opens a new one: also while a registration is in flight (its request number changes, so its
        success is not taken for a live stream). Answers the delay before that (None: no registration).
        A stream opened before the last kubelet restart was taken in changes nothing: that restart
        registers everything again, at once."""
        b = self._backoff
        with self._lock:
            now = self._clock()
            if self._restarted_at is not None and now - lived_s < self._restarted_at:
                # The gone kubelet's stream, its end told after the restart was taken in (the streams end
                # on their own threads): the restart queued every resource already, with no settle time
                # and no backoff, and neither may come back from this late news.
                return None
            self._stream_ended[name] = now
            if not lost or self._servers.get(name) is not server:
                return None
            streak = 0 if lived_s >= b.stable_stream_s else self._losses.get(name, 0) + 1
            self._losses[name] = streak
            delay = 0.0 if streak <= 1 else min(b.min_retry_s * 2 ** (streak - 2), b.max_retry_s)
            self._registered.discard(name)
            self._pending[name] = next(self._requests)
            self._not_before[name] = now + delay
        self.wake()
        return delay

    def kubelet_restarted(self) -> None:
        """A new kubelet: every socket served anew, every resource registered again, nothing held back."""
        with self._lock:
            self._restarted()
        self.wake()

    def kubelet_socket_created(self, kubelet_inode: KubeletSocketId | None) -> bool:
        """kubelet.sock (of `kubelet_inode`) was created: a new kubelet (True), unless it is the kubelet
        registered with or being registered with already, which the registrar found first (False, nothing
        done). Registering with that kubelet again would make it replace its client of each resource, and
        the end of the first client's stream disconnects the second (kubelet's disconnect race)."""
        with self._lock:
            if kubelet_inode is not None and kubelet_inode in (self._kubelet_inode, self._registering_with):
                return False
            self._restarted()
        self.wake()
        return True

    def _restarted(self) -> None:
        """Under the lock: what a new kubelet means."""
        self._registering_with = None
        self._rebind.update(self._servers)
        self._pending.update({name: next(self._requests) for name in self._servers})
        self._registered.clear()
        self._kubelet_inode = None
        self._not_before.clear()
        self._stream_ended.clear()
        self._losses.clear()  # the gone kubelet's streams say nothing of how the new one keeps them
        self._restarted_at = self._clock()

    # ---- what the registrar asks and says ------------------------------------------------------

    def wake(self) -> None:
        """There is registrar work (or a check) to do now."""
        self._wake.set()

    def wait(self, timeout_s: float) -> None:
        """Until woken, the earliest deferred registration is due, or `timeout_s` passed."""
        with self._lock:
            next_due = self._next_due
        if next_due is not None:
            timeout_s = min(timeout_s, max(0.0, next_due - self._clock()))
        self._wake.wait(timeout=timeout_s)
        self._wake.clear()

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Held while starting or stopping servers, so that no two threads do it to one server at once."""
        with self._serving:
            yield

    def server(self, name: str) -> S | None:
        with self._lock:
            return self._servers.get(name)

    def servers(self) -> dict[str, S]:
        with self._lock:
            return dict(self._servers)

    def to_check(self) -> tuple[dict[str, S], KubeletSocketId | None]:
        """The servers whose socket is believed intact, and the inode of the kubelet.sock registered with."""
        with self._lock:
            intact = {n: s for n, s in self._servers.items() if n not in self._rebind}
            return intact, self._kubelet_inode

    def to_rebind(self) -> list[str]:
        with self._lock:
            return sorted(self._rebind)

    def rebound(self, name: str) -> None:
        """`name`'s socket is served again."""
        with self._lock:
            self._rebind.discard(name)

    def due(self, kubelet_inode: KubeletSocketId | None) -> Due[S]:
        """The registrations to send now to the kubelet whose socket has `kubelet_inode`. Not before kubelet's
        client of a resource's previous stream has looked up whom to disconnect (kubelet's disconnect race;
        not waited for with a new kubelet), nor before a backoff ends; the earliest later one wakes `wait`."""
        with self._lock:
            now = self._clock()
            fresh = self._kubelet_inode is None or kubelet_inode != self._kubelet_inode
            waiting = [n for n in sorted(self._pending) if n in self._servers and n not in self._rebind]
            at = {n: self._due_at(n, fresh) for n in waiting}
            later = [t for t in at.values() if t > now]
            self._next_due = min(later) if later else None
            todo = [Registration(n, self._servers[n], self._pending[n]) for n in waiting if at[n] <= now]
            if todo:
                self._registering_with = kubelet_inode
            return Due(todo, bool(self._rebind))

    def accepted(self, registration: Registration[S], kubelet_inode: KubeletSocketId) -> bool:
        """Kubelet accepted `registration`: recorded (True), unless it is stale by now."""
        name = registration.name
        with self._lock:
            if self._servers.get(name) is not registration.server:
                return False  # replaced or stopped while we were registering
            if self._pending.get(name) != registration.request:
                return False  # kubelet restarted (or dropped the stream) meanwhile: registered again next
            del self._pending[name]
            self._not_before.pop(name, None)
            self._registered.add(name)
            self._kubelet_inode = kubelet_inode
        return True

    # ---- what anyone may read ------------------------------------------------------------------

    def registered(self) -> set[str]:
        with self._lock:
            return set(self._registered)

    def served(self) -> set[str]:
        with self._lock:
            return set(self._servers)

    def all_registered(self) -> bool:
        with self._lock:
            return bool(self._servers) and self._registered == set(self._servers)

    def unregistered(self) -> tuple[list[str], dict[str, S]]:
        """The served resources not registered (sorted), and the servers of the registered ones."""
        with self._lock:
            missing = sorted(set(self._servers) - self._registered)
            registered = {n: self._servers[n] for n in sorted(self._registered) if n in self._servers}
            return missing, registered

    # ---- under the lock ------------------------------------------------------------------------

    def _socket_lost(self, name: str) -> None:
        self._rebind.add(name)
        self._pending[name] = next(self._requests)
        self._registered.discard(name)

    def _forget(self, name: str) -> S | None:
        self._registered.discard(name)
        self._pending.pop(name, None)
        self._rebind.discard(name)
        self._not_before.pop(name, None)
        self._losses.pop(name, None)
        return self._servers.pop(name, None)

    def _due_at(self, name: str, fresh_kubelet: bool) -> float:
        ended = None if fresh_kubelet else self._stream_ended.get(name)
        settled = 0.0 if ended is None else ended + self._backoff.settle_s
        return max(self._not_before.get(name, 0.0), settled)

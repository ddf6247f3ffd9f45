"""The ListAndWatch streams of one resource server: which one is kubelet's, how many others, what they send.

Kubelet opens one stream per registration and reads it for as long as the registration lives; when that
stream ends, kubelet marks every device of the resource Unhealthy and never dials back (only a new
Register brings the resource back). Anyone else who can reach the socket (a `grpcurl` while debugging)
can open streams too. So:

* kubelet's stream is the first one opened after the plugin sent a Register (`expect_kubelet`); every
  other stream is a stranger's, or an older registration's;
* besides kubelet's, at most MAX_OTHER_STREAMS streams stay open; a new one past that ends the oldest of
  the others, never kubelet's. Each open stream holds one gRPC worker, so streams can never take the
  workers Allocate needs;
* when kubelet's stream ends, `on_kubelet_end(lived_s, lost)` is called; `lost` when it ended for any
  reason but the server's own stop (the manager registers again, so that kubelet opens a new stream);
  `missing_since` says since when the resource has had no kubelet stream, for the liveness probe;
* pushes are coalesced: a stream sends a change at once, but after a burst of PUSH_BURST pushes at most
  one every PUSH_INTERVAL_S; changes in between are merged, and the next push carries the latest list.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb

log = logging.getLogger(__name__)

# Streams kept open besides kubelet's: enough for one debugging client (or a registration kubelet has
# since replaced), few enough that the gRPC workers stay free for Allocate.
MAX_OTHER_STREAMS = 1
# Pushes per stream: a burst at once, then one per interval at most (a flapping GPU would otherwise
# make one push, and one kubelet checkpoint write, per health flip).
PUSH_BURST = 20
PUSH_INTERVAL_S = 0.1

DeviceList = Callable[[], pb.ListAndWatchResponse]
KubeletStreamEnded = Callable[[float, bool], None]  # (seconds it lived, lost: not ended by our stop)


class _PushBudget:
    """A token bucket: `burst` pushes at once, refilled at one per `interval` seconds."""

    def __init__(self, burst: int, interval: float) -> None:
        self._burst = burst
        self._interval = interval
        self._tokens = float(burst)
        self._at = time.monotonic()

    def wait_s(self) -> float:
        """Seconds until a push may go (0: now)."""
        now = time.monotonic()
        if self._interval > 0:
            self._tokens = min(self._burst, self._tokens + (now - self._at) / self._interval)
        else:
            self._tokens = float(self._burst)
        self._at = now
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) * self._interval

    def spend(self) -> None:
        self._tokens -= 1


class StreamSet:
    """The open ListAndWatch streams of one resource (see the module docstring)."""

    def __init__(
        self, resource_name: str, device_list: DeviceList, on_kubelet_end: KubeletStreamEnded
    ) -> None:
        self._resource = resource_name
        self._device_list = device_list
        self._on_kubelet_end = on_kubelet_end
        self._changed = threading.Condition()
        self._version = 0
        self._stopping = False
        self._numbers = 0
        self._open: dict[int, grpc.ServicerContext] = {}  # in opening order
        self._kubelet: int | None = None  # number of kubelet's stream
        self._kubelet_opened = 0.0
        self._awaiting_kubelet = False
        self._missing_since: float | None = time.monotonic()

    # ---- what the server and the manager call ------------------------------------------------------

    def serving(self) -> None:
        """The server (re)started: streams may open."""
        with self._changed:
            self._stopping = False

    def stop(self) -> None:
        """The server stops: every stream ends, and that is not a loss."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()

    def notify(self) -> None:
        """The device list changed: every open stream sends it again (coalesced, see above)."""
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def expect_kubelet(self, expected: bool = True) -> None:
        """A Register is about to be sent (True): the next stream opened is kubelet's. False: it failed."""
        with self._changed:
            self._awaiting_kubelet = expected
            if expected and self._kubelet is None:
                self._missing_since = time.monotonic()

    def missing_since(self) -> float | None:
        """time.monotonic() since when no kubelet stream is open; None while one is."""
        with self._changed:
            return self._missing_since

    # ---- one stream --------------------------------------------------------------------------------

    def open(self, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        with self._changed:
            self._numbers += 1
            number = self._numbers
            self._open[number] = context
            kubelets = self._awaiting_kubelet
            if kubelets:
                self._awaiting_kubelet = False
                self._kubelet, self._kubelet_opened, self._missing_since = number, time.monotonic(), None
            others = [n for n in self._open if n != self._kubelet]
            evicted = [self._open.pop(n) for n in others[: max(0, len(others) - MAX_OTHER_STREAMS)]]
            self._changed.notify_all()
        # Cancelling (not only waking) also frees a stream whose thread is blocked sending to a client
        # that never reads.
        for stale in evicted:
            stale.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves it unannotated
        whose = "kubelet's" if kubelets else "another client's"
        ending = f", ending {len(evicted)} other stream(s) past the bound" if evicted else ""
        log.info("ListAndWatch stream opened for %s (%s)%s", self._resource, whose, ending)
        return self._stream(number, context)

    def _stream(self, number: int, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        def wake() -> None:
            with self._changed:
                self._changed.notify_all()

        def ended() -> bool:
            return self._stopping or number not in self._open or not context.is_active()

        context.add_callback(wake)
        budget = _PushBudget(PUSH_BURST, PUSH_INTERVAL_S)
        try:
            while True:
                with self._changed:
                    seen = self._version
                    if ended():
                        return
                budget.spend()
                yield self._device_list()
                with self._changed:
                    while not ended():
                        if self._version == seen:
                            self._changed.wait()
                            continue
                        pause = budget.wait_s()
                        if pause <= 0:
                            break
                        self._changed.wait(pause)  # changes meanwhile are merged into the next push
                    if ended():
                        return
        finally:
            self._closed(number)

    def _closed(self, number: int) -> None:
        with self._changed:
            self._open.pop(number, None)
            lost = number == self._kubelet
            if lost:
                self._kubelet, self._missing_since = None, time.monotonic()
            lost_unasked = lost and not self._stopping
            lived = time.monotonic() - self._kubelet_opened
        if lost_unasked:
            log.warning("kubelet's ListAndWatch stream for %s ended after %.1fs", self._resource, lived)
        else:
            log.info("ListAndWatch stream closed for %s", self._resource)
        if lost:
            self._on_kubelet_end(lived, lost_unasked)

"""The ListAndWatch streams of one resource server: which one is kubelet's, how many others, what they send.

Kubelet opens one stream per registration and reads it for as long as the registration lives; when that
stream ends, kubelet marks every device of the resource Unhealthy and never dials back (only a new
Register brings the resource back). Anyone else who can reach the socket (a `grpcurl` while debugging, a
script that opens streams in a loop) can open streams too, also while a Register is in flight. So:

* kubelet's stream opens while the plugin registers: inside its Register handler kubelet dials the plugin
  back, asks GetDevicePluginOptions (`dialled_back`), then starts the stream, and answers. So a stream is
  a candidate for kubelet's only if it opened after that GetDevicePluginOptions and before Register
  returned (`registered`); one opened earlier in the registration (a stranger's, however close to the
  answer) is another client's. A candidate never ends another stream and is never ended for another's
  sake (at most MAX_REGISTERING_STREAMS at once; one more is refused). When Register returns: exactly one
  candidate, still open, and none ended or refused -> it is kubelet's. None opened yet -> the first stream
  opened next is kubelet's (kubelet's may land just after the answer). But when the registration is
  contested (another client opened a stream while it was in flight, or in the RECENT_OTHER_STREAM_S
  before), a stranger's stream could be that first one: the window then stays open CONTESTED_SETTLE_S
  past the answer, every stream opened until then is a candidate, and the verdict is taken when it
  closes. None left open -> kubelet's stream (if it came) is gone: `on_kubelet_end(0, True)`, so the
  manager registers again. Anything else -> the plugin cannot tell which is kubelet's: the candidates
  stay open and protected, `missing_since` stays set (so /healthz fails after the grace period) and, once
  all of them ended, that is taken as a lost kubelet stream. One order stays beyond telling: a client's
  first stream in RECENT_OTHER_STREAM_S, opened after kubelet dialled back and before kubelet's own, is
  taken for kubelet's, and kubelet's, coming after the answer, for another's. (gRPC tells a unix-socket
  server nothing about its peer, neither credentials nor which connection a call came on: context.peer()
  is "unix:" and auth_context() the same for every client, so the order of calls around Register is what
  is left to go by.);
* every stream opened outside that window is another client's: at most MAX_OTHER_STREAMS of them stay
  open, a new one past that ends the oldest of them, never kubelet's or a candidate. Each open stream holds
  one gRPC worker, so streams can never take the workers Allocate needs;
* when kubelet's stream ends, `on_kubelet_end(lived, lost)` is called; `lost` when it ended for any reason
  but the server's own stop; `missing_since` says since when the resource has had no stream known to be
  kubelet's, for the liveness probe;
* the lines about other clients' streams opening and closing are rate-limited per resource (a client
  churning streams would otherwise write two lines per stream); lines about kubelet's stream are not;
* pushes are coalesced: a stream sends a change at once, but after a burst of PUSH_BURST pushes at most
  one every PUSH_INTERVAL_S; changes in between are merged, and the next push carries the latest list.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.base.logs import RateLimitedLog

log = logging.getLogger(__name__)

# Streams kept open besides kubelet's: enough for one debugging client (or a registration kubelet has
# since replaced), few enough that the gRPC workers stay free for Allocate.
MAX_OTHER_STREAMS = 1
# Streams opened while registering, kept open at once: kubelet's and a few strangers' that raced it. One
# more is refused, and that may be kubelet's (kubelet then marks the devices Unhealthy): kubelet's comes
# within milliseconds of its dial-back, but a client opening a stream every 5 ms filled three places before
# it on a loaded machine. With kubelet's previous one and MAX_OTHER_STREAMS others, eight of the server's
# twelve workers at most (server.WORKERS).
MAX_REGISTERING_STREAMS = 6
# A registration is contested when another client opened a stream while it was in flight or this long
# before it: then kubelet's stream, which may land just after the answer, is waited for this long after the
# answer instead of taking the first stream that comes (a client opening streams every few milliseconds
# would win that race about one time in three).
CONTESTED_SETTLE_S = 0.5
RECENT_OTHER_STREAM_S = 10.0
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


@dataclass
class _Registering:
    """What was opened while a Register was in flight: kubelet's stream is among the candidates."""

    candidates: list[int] = field(default_factory=list)  # open ones, in opening order
    ended: int = 0  # candidates that ended before the window closed
    refused: int = 0  # streams refused because MAX_REGISTERING_STREAMS were open
    dialled_back: bool = False  # GetDevicePluginOptions was asked since the Register was sent
    returned: bool = False  # Register returned OK, before any stream opened: the next one is kubelet's
    contested: bool = False  # another client opened streams while registering (or just before)
    closes_at: float | None = None  # contested and answered: the window closes then

    @property
    def opened_any(self) -> bool:
        return bool(self.candidates or self.ended or self.refused)


@dataclass(frozen=True)
class _Verdict:
    """What closing a window found (logged and acted on outside the lock)."""

    kubelet: int | None = None
    unsure: int = 0  # candidates kept, none of which is known to be kubelet's
    lost: bool = False
    none: bool = False  # contested, and no stream opened after kubelet dialled back


class StreamSet:
    """The open ListAndWatch streams of one resource (see the module docstring)."""

    def __init__(
        self,
        resource_name: str,
        device_list: DeviceList,
        on_kubelet_end: KubeletStreamEnded,
        lines: RateLimitedLog | None = None,
    ) -> None:
        self._resource = resource_name
        self._device_list = device_list
        self._on_kubelet_end = on_kubelet_end
        # Without a log of the owner's (whose worker writes the summaries as windows end), the set keeps its
        # own and writes the summaries left when it stops.
        self._own_lines = lines is None
        self._lines = RateLimitedLog(log) if lines is None else lines
        self._lines_key = f"ListAndWatch streams of {resource_name}"
        self._changed = threading.Condition()
        self._version = 0
        self._stopping = False
        self._numbers = 0
        self._open: dict[int, grpc.ServicerContext] = {}  # in opening order
        self._kubelet: int | None = None  # number of kubelet's stream
        self._kubelet_opened = 0.0
        # While a Register is in flight, or answered before any stream opened.
        self._registering: _Registering | None = None
        self._unsure: set[int] = set()  # candidates of a window that could not tell which is kubelet's
        self._last_other_at: float | None = None  # when another client last opened a stream
        self._timer: threading.Timer | None = None  # closes a contested window when it is due
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
            self._registering = None  # a registration window ends with the streams it was about
            timer, self._timer = self._timer, None
            self._changed.notify_all()
        if timer is not None:
            timer.cancel()
        if self._own_lines:
            self._lines.cleanup()

    def notify(self) -> None:
        """The device list changed: every open stream sends it again (coalesced, see above)."""
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def expect_kubelet(self, expected: bool = True) -> None:
        """A Register is about to be sent (True): kubelet's stream is among those opened from now until the
        window closes. False: that Register failed; the streams opened meanwhile are other clients'."""
        with self._changed:
            # Streams of an earlier window that could not be told apart become others: a new registration
            # replaces kubelet's client of them.
            self._unsure.clear()
            self._registering = _Registering(contested=self._others_recently()) if expected else None
            if expected and self._kubelet is None:
                self._missing_since = time.monotonic()
            # Registrations that failed (a Register timing out while kubelet opened its stream each time)
            # leave streams behind that are nobody's now: held to the bound of the others here.
            evicted = self._trim_others()
        for stale in evicted:
            stale.cancel()  # type: ignore[no-untyped-call]

    def registered(self) -> None:
        """Kubelet accepted the Register: its stream has opened, or is the next one to open."""
        with self._changed:
            window = self._registering
            verdict = None
            if window is not None and window.contested:
                window.closes_at = time.monotonic() + CONTESTED_SETTLE_S
                self._schedule(window)
            elif window is not None and window.opened_any:
                verdict = self._close(window)
            elif window is not None:
                window.returned = True
        self._act(verdict)

    def dialled_back(self) -> None:
        """GetDevicePluginOptions was asked: while registering, that is kubelet dialling back, and its
        stream comes next."""
        with self._changed:
            if self._registering is not None:
                self._registering.dialled_back = True

    def missing_since(self) -> float | None:
        """time.monotonic() since when no stream known to be kubelet's is open; None while one is."""
        with self._changed:
            return self._missing_since

    def unsure(self) -> bool:
        """Whether streams are open that may be kubelet's, but the plugin cannot tell which one is."""
        with self._changed:
            return bool(self._unsure)

    # ---- one stream --------------------------------------------------------------------------------

    def open(self, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        with self._changed:
            verdict = self._close_if_due()
            self._numbers += 1
            number = self._numbers
            role = self._admit(number)
            if role != "refused":
                self._open[number] = context
            evicted = self._trim_others() if role == "other" else []
            self._changed.notify_all()
        self._act(verdict)
        if role == "kubelet":
            log.info("ListAndWatch stream opened for %s (kubelet's)", self._resource)
            return self._stream(number, context)
        if role == "refused":
            self._lines.log(self._lines_key, logging.WARNING, "%s", refused := self._refusal())
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
        # Cancelling (not only waking) also frees a stream whose thread is blocked sending to a client
        # that never reads.
        for stale in evicted:
            stale.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves it unannotated
        whose = "a candidate for kubelet's, opened while registering" if role == "candidate" else "another"
        ending = f", ending {len(evicted)} other stream(s) past the bound" if evicted else ""
        self._lines.log(
            self._lines_key,
            logging.INFO,
            "ListAndWatch stream opened for %s (%s)%s",
            self._resource,
            whose,
            ending,
        )
        return self._stream(number, context)

    def _refusal(self) -> str:
        return (
            f"{MAX_REGISTERING_STREAMS} ListAndWatch streams of {self._resource} opened while registering "
            "are open already; refusing more until kubelet answers the Register"
        )

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
            window = self._registering
            if window is not None and number in window.candidates:
                window.candidates.remove(number)
                window.ended += 0 if self._stopping else 1
            lost = number == self._kubelet
            if lost:
                self._kubelet, self._missing_since = None, time.monotonic()
            lost_unasked = lost and not self._stopping
            lived = time.monotonic() - self._kubelet_opened
            last_unsure = number in self._unsure and len(self._unsure) == 1 and not self._stopping
            self._unsure.discard(number)
        if lost_unasked:
            log.warning("kubelet's ListAndWatch stream for %s ended after %.1fs", self._resource, lived)
        elif lost:
            log.info("kubelet's ListAndWatch stream closed for %s", self._resource)
        else:
            self._lines.log(
                self._lines_key, logging.INFO, "ListAndWatch stream closed for %s", self._resource
            )
        if lost:
            self._on_kubelet_end(lived, lost_unasked)
        elif last_unsure:
            self._act(_Verdict(lost=True))

    # ---- the registration window (under the lock, but _act) ----------------------------------------

    def _admit(self, number: int) -> str:
        """What a new stream is: "kubelet" (the first after an accepted Register that had none), "candidate"
        (opened while registering, after kubelet dialled back), "refused" (past MAX_REGISTERING_STREAMS of
        those) or "other"."""
        window = self._registering
        if window is None or not (window.dialled_back or window.returned or window.closes_at is not None):
            self._last_other_at = time.monotonic()
            if window is not None:
                window.contested = True
            return "other"
        if window.returned:
            self._registering = None
            self._kubelet, self._kubelet_opened, self._missing_since = number, time.monotonic(), None
            return "kubelet"
        if len(window.candidates) >= MAX_REGISTERING_STREAMS:
            window.refused += 1
            return "refused"
        window.candidates.append(number)
        return "candidate"

    def _trim_others(self) -> list[grpc.ServicerContext]:
        """Other clients' streams past MAX_OTHER_STREAMS, oldest first, taken out of the open ones."""
        window = self._registering
        protected = {self._kubelet, *self._unsure, *(window.candidates if window is not None else ())}
        others = [n for n in self._open if n not in protected]
        return [self._open.pop(n) for n in others[: max(0, len(others) - MAX_OTHER_STREAMS)]]

    def _others_recently(self) -> bool:
        at = self._last_other_at
        return at is not None and time.monotonic() - at < RECENT_OTHER_STREAM_S

    def _schedule(self, window: _Registering) -> None:
        """Close the contested `window` when it is due, should no stream open to close it sooner."""
        if self._timer is not None:
            self._timer.cancel()
        delay = 0.0 if window.closes_at is None else max(0.0, window.closes_at - time.monotonic())
        self._timer = threading.Timer(delay, self._settle, (window,))
        self._timer.name = f"streams-settle-{self._resource}"
        self._timer.daemon = True
        self._timer.start()

    def _settle(self, window: _Registering) -> None:
        with self._changed:
            verdict = self._close_if_due() if self._registering is window else None
        self._act(verdict)

    def _close_if_due(self) -> _Verdict | None:
        window = self._registering
        if window is None or window.closes_at is None or time.monotonic() < window.closes_at:
            return None
        return self._close(window)

    def _close(self, window: _Registering) -> _Verdict:
        """The verdict on the registration window: Register returned, and streams opened meanwhile."""
        self._registering = None
        if self._stopping:
            return _Verdict()
        open_now = [n for n in window.candidates if n in self._open]
        if len(open_now) == 1 and not window.ended and not window.refused:
            self._kubelet, self._kubelet_opened, self._missing_since = open_now[0], time.monotonic(), None
            return _Verdict(kubelet=open_now[0])
        if not open_now:
            return _Verdict(lost=True) if window.ended or window.refused else _Verdict(none=True)
        self._unsure = set(open_now)
        return _Verdict(unsure=len(open_now))

    def _act(self, verdict: _Verdict | None) -> None:
        """Say what closing a window found, and answer a lost kubelet stream (outside the lock)."""
        if verdict is None:
            return
        if verdict.kubelet is not None:
            log.info(
                "ListAndWatch stream of %s (kubelet's): the one opened while registering", self._resource
            )
        elif verdict.unsure:
            log.warning(
                "cannot tell which of the %d ListAndWatch streams of %s opened while registering is "
                "kubelet's (another client opened streams at the same time); none of them is ended for "
                "another's sake, and /healthz fails if this lasts",
                verdict.unsure,
                self._resource,
            )
        elif verdict.none:
            log.warning(
                "kubelet opened no ListAndWatch stream of %s within %gs of answering Register while another "
                "client opened streams; /healthz fails if none is known to be kubelet's",
                self._resource,
                CONTESTED_SETTLE_S,
            )
        elif verdict.lost:
            log.warning("no ListAndWatch stream of %s that may be kubelet's is open any more", self._resource)
            self._on_kubelet_end(0.0, True)

"""Kubelet's DRA health stream (dra-health `DRAResourceHealth.NodeWatchResources`) on dra.sock.

Kubelet (feature ResourceHealthStatus) opens one stream per registered plugin when the plugin lists a
DRAResourceHealth service among its supported versions at registration (older kubelets open v1alpha1
regardless), and shows what it hears in the pod's `status.containerStatuses[].allocatedResourcesStatus`.
Every message carries the full list of the driver's devices (kubelet reconciles its cache with it); a
device kubelet hears nothing of for its `health_check_timeout_seconds` turns Unknown, so the full list
goes out on connect, at once on every change, and again every RESEND_INTERVAL_S while nothing changes.

Kubelet's API has three versions (v1, v1beta1, v1alpha1), field for field the same: each is served
(SERVICES, newest first, is also the registration's order), all from the one feed and the one stream logic;
a version only names the service and parses its own (empty) request.

`HealthFeed` holds the latest reports (dra/device_health.py) for every open stream; the DRA mode
replaces them whole on each snapshot, handover and health change. Each stream holds one of the endpoint's
server threads while open: at most MAX_STREAMS at once, whatever their versions (more are refused
RESOURCE_EXHAUSTED), and a stream whose client went away, or whose server stops, ends at once and gives its
thread back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import grpc
from google.protobuf.message import Message

from nvidia_device_plugin.api.dra_health.v1 import api_pb2 as health_pb
from nvidia_device_plugin.api.dra_health.v1alpha1 import api_pb2 as v1alpha1_pb
from nvidia_device_plugin.api.dra_health.v1beta1 import api_pb2 as v1beta1_pb
from nvidia_device_plugin.dra.device_health import DeviceHealthReport, HealthStatus
from nvidia_device_plugin.plugin.protocol import RequestError, parse
from nvidia_device_plugin.plugin.server import shorten

log = logging.getLogger(__name__)

# Each version's gRPC service (its name in the registration's supported versions too, spelled as kubelet's
# DRAResourceHealthService constants) and the request it parses. The requests are all empty and the
# responses wire-identical across versions (the same fields, numbers and types; tests compare the
# descriptors), so every version sends the feed's one message. Newest first, the registration's order:
# kubelet 1.37+ takes v1 wherever it is listed, and a kubelet that takes the first name it knows takes the
# newest it knows.
_REQUESTS: dict[str, type[Message]] = {
    "v1.DRAResourceHealth": health_pb.NodeWatchResourcesRequest,
    "v1beta1.DRAResourceHealth": v1beta1_pb.NodeWatchResourcesRequest,
    "v1alpha1.DRAResourceHealth": v1alpha1_pb.NodeWatchResourcesRequest,
}
SERVICES = tuple(_REQUESTS)
METHOD = "NodeWatchResources"
RESEND_INTERVAL_S = 10.0
# What each device carries: kubelet marks a device Unknown after this long without news. Three resends,
# so a loaded node missing one or two does not flap (kubelet's own default is 30 s as well).
HEALTH_CHECK_TIMEOUT_S = 30
MAX_STREAMS = 2  # kubelet keeps one; a restarting kubelet's new one may overlap the old one's end
MAX_REQUEST_BYTES = 1024  # the request has no fields; more is refused INVALID_ARGUMENT
MAX_MESSAGE_CHARS = 1024  # kubelet truncates longer messages
_STATUS = {
    HealthStatus.HEALTHY: health_pb.HEALTHY,
    HealthStatus.UNHEALTHY: health_pb.UNHEALTHY,
    HealthStatus.UNKNOWN: health_pb.UNKNOWN,
}


@dataclass(frozen=True)
class _Stamped:
    report: DeviceHealthReport
    determined: int  # Unix seconds: when this status (and message) was first reported


class HealthFeed:
    """The latest health reports of the driver's devices, and the streams that wait for them.

    `update` replaces the reports whole (a call with equal reports changes nothing); `close` ends every
    stream (the plugin stops). Thread-safe. `clock` gives Unix seconds (for a report's last_updated_time
    when it has no verdict time of its own)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._changed = threading.Condition()
        self._refreshing = threading.Lock()
        self._stamped: dict[tuple[str, str], _Stamped] = {}
        self._message: bytes | None = None  # None: nothing known yet (before the first update)
        self._version = 0
        self._streams = 0
        self._closed = False

    def update(self, reports: Sequence[DeviceHealthReport]) -> bool:
        """Take `reports` (every device, in order); True (and every stream told at once) when they differ."""
        with self._changed:
            if self._message is not None and [s.report for s in self._stamped.values()] == list(reports):
                return False
            now = int(self._clock())
            stamped = {}
            for report in reports:
                key = (report.pool, report.device)
                old = self._stamped.get(key)
                same = old is not None and (old.report.status, old.report.message) == (
                    report.status,
                    report.message,
                )
                stamped[key] = old if same and old is not None else _Stamped(report, now)
            self._stamped = stamped
            self._message = _response(stamped.values()).SerializeToString()
            self._version += 1
            self._changed.notify_all()
        return True

    def refresh(self, reports: Callable[[], Sequence[DeviceHealthReport]]) -> bool:
        """`update(reports())`, one refresh at a time: of two threads refreshing at once, the one that
        reads last also updates last, so the feed never ends on the older reading."""
        with self._refreshing:
            return self.update(reports())

    @property
    def streams(self) -> int:
        """Streams open now."""
        with self._changed:
            return self._streams

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wake(self) -> None:
        """Make every waiting stream look at its client again (one went away)."""
        with self._changed:
            self._changed.notify_all()

    # ---- what a stream does ----------------------------------------------------------------------

    def open_stream(self) -> bool:
        with self._changed:
            if self._streams >= MAX_STREAMS or self._closed:
                return False
            self._streams += 1
            return True

    def close_stream(self) -> None:
        with self._changed:
            self._streams -= 1
            self._changed.notify_all()

    def next_message(
        self, seen: int, active: Callable[[], bool], timeout: float
    ) -> tuple[int, bytes | None] | None:
        """What a stream that sent version `seen` sends next: (version, message) once a later version is
        there, or after `timeout` (the same message again, a resend; message None before anything is
        known: nothing to send); None once the feed closed or the client is gone (the stream ends)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._version == seen and not self._closed and active():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            if self._closed or not active():
                return None
            return self._version, self._message


def _response(stamped: Iterable[_Stamped]) -> Message:
    response = health_pb.NodeWatchResourcesResponse()
    for entry in stamped:
        report = entry.report
        since = int(report.since.timestamp()) if report.since is not None else entry.determined
        response.devices.add(
            device=health_pb.DeviceIdentifier(pool_name=report.pool, device_name=report.device),
            health=_STATUS[report.status],
            last_updated_time=since,
            health_check_timeout_seconds=HEALTH_CHECK_TIMEOUT_S,
            message=shorten(report.message, MAX_MESSAGE_CHARS),
        )
    return response


def health_handlers(
    feed: HealthFeed, resend_interval_s: float = RESEND_INTERVAL_S
) -> list[grpc.GenericRpcHandler[bytes, Message]]:
    """Each version's DRAResourceHealth service, all answered from `feed` (messages go out serialized)."""
    return [
        grpc.method_handlers_generic_handler(
            service,
            {METHOD: grpc.unary_stream_rpc_method_handler(_watch(feed, resend_interval_s, service))},
        )
        for service in SERVICES
    ]


def _watch(
    feed: HealthFeed, resend_interval_s: float, service: str
) -> Callable[[bytes, grpc.ServicerContext], Iterator[bytes]]:
    """NodeWatchResources of `service`: the same stream for every version, only the request type its own."""
    request_type = _REQUESTS[service]

    def watch(raw: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        try:
            if len(raw) > MAX_REQUEST_BYTES:  # the endpoint's own bound is the DRA calls' (1 MiB)
                raise RequestError(f"a NodeWatchResourcesRequest of {len(raw)} bytes (no field is known)")
            parse(request_type, raw)
        except RequestError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, shorten(str(exc)))
        if not feed.open_stream():
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {MAX_STREAMS} DRA health streams at once, or the plugin is stopping",
            )
        context.add_callback(feed.wake)  # the client went away, or the server stops: stop waiting
        log.info("kubelet opened the DRA health stream (%s)", service)
        try:
            seen = 0
            while (step := feed.next_message(seen, context.is_active, resend_interval_s)) is not None:
                seen, message = step
                if message is not None:
                    yield message
        finally:
            feed.close_stream()
            log.info("the DRA health stream (%s) closed", service)

    return watch

"""One kubelet DevicePlugin gRPC server for one resource, on its own unix socket.

The server knows nothing about GPUs: a ResourceBackend answers what devices exist and how to
allocate them; this module serves them as the v1beta1 DevicePlugin service (protocol.py parses and bounds
the requests) and turns project errors into gRPC codes.

ListAndWatch streams (kubelet's, a few opened while registering and at most one other, so they never take
the workers Allocate needs) are kept by streams.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol, TypeVar, runtime_checkable

import grpc
from google.protobuf.message import Message

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.base.errors import AllocationError
from nvidia_device_plugin.base.logs import RateLimitedLog
from nvidia_device_plugin.plugin import protocol
from nvidia_device_plugin.plugin.events import NO_PLUGIN_EVENTS, CallError, CallMethod, PluginEvents
from nvidia_device_plugin.plugin.streams import StreamSet
from nvidia_device_plugin.plugin.unix_server import UnixServer

log = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M", bound=Message)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# Worker threads per resource: kubelet's stream, MAX_REGISTERING_STREAMS and MAX_OTHER_STREAMS others, the
# rest (four) for unary calls, of which GetPreferredAllocation holds three at most.
WORKERS = 12
# Calls accepted at once (running or queued for a worker); more get RESOURCE_EXHAUSTED at once instead of
# queueing without bound, each holding up to MAX_REQUEST_BYTES.
MAX_CONCURRENT_CALLS = 64
# gRPC carries the status message in a header (16 KiB limit); an error quoting a 2 MB device ID would
# arrive as RESOURCE_EXHAUSTED instead of the real code, and flood the log.
MAX_ERROR_CHARS = 1024


def shorten(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... ({len(text)} characters in all)"


@dataclass(frozen=True)
class DeviceState:
    """One device as ListAndWatch shows it."""

    id: str
    healthy: bool
    numa_node: int | None = None


class ResourceBackend(Protocol):
    """What a resource server needs from the application."""

    def devices(self) -> Sequence[DeviceState]: ...

    def allocate(self, requests: Sequence[Sequence[str]]) -> pb.AllocateResponse: ...

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]: ...


@runtime_checkable
class PreferredGate(Protocol):
    """A backend that bounds its GetPreferredAllocation calls at once says when one would be refused now:
    the server then refuses it before parsing the request, so a flood's refused calls cost next to nothing
    (a request of 3 x 2,800 IDs took longer to parse than to refuse)."""

    def preferred_refusal(self) -> str | None: ...


def _never_refused() -> str | None:
    return None


def device_list_message(states: Sequence[DeviceState]) -> pb.ListAndWatchResponse:
    """The ListAndWatch message for `states`, each device made inside the response: a `pb.Device` made on
    its own and then copied in costs a message arena of its own (800 devices: 2.4 ms and 1 MB touched in
    the serving thread's heap, against 1.3 ms and 0.3 MB)."""
    response = pb.ListAndWatchResponse()
    add = response.devices.add
    for state in states:
        device = add(ID=state.id, health=HEALTHY if state.healthy else UNHEALTHY)
        if state.numa_node is not None:
            device.topology.nodes.add(ID=state.numa_node)
    return response


class ResourceServer:
    """Serves one resource on `socket_path` until stopped. start() may be called again after stop()."""

    def __init__(
        self,
        resource_name: str,
        socket_path: Path,
        backend: ResourceBackend,
        events: PluginEvents = NO_PLUGIN_EVENTS,
        max_workers: int = WORKERS,
        on_kubelet_stream_end: Callable[[ResourceServer, float, bool], None] | None = None,
        stream_lines: RateLimitedLog | None = None,
    ) -> None:
        self.resource_name = resource_name
        self.socket_path = socket_path
        self._events = events
        self._on_kubelet_stream_end = on_kubelet_stream_end  # (server, seconds it lived, lost unasked)
        self.streams = StreamSet(resource_name, self._device_list, self._kubelet_stream_ended, stream_lines)
        # Refused calls that a client can repeat in a loop, limited per resource; a fresh one per start().
        self._call_lines = RateLimitedLog(log, name="plugin-call-lines")
        self.backend = backend
        self._unix = UnixServer(
            resource_name,
            socket_path,
            (handlers(self),),
            protocol.MAX_REQUEST_BYTES,
            protocol.MAX_RESPONSE_BYTES,
            workers=max_workers,
            max_calls=MAX_CONCURRENT_CALLS,
        )

    @property
    def backend(self) -> ResourceBackend:
        return self._backend

    @backend.setter
    def backend(self, backend: ResourceBackend) -> None:
        # Bounds the IDs a request may name; counted once here, not on every Allocate.
        self.device_count = len(backend.devices())
        self.preferred_refusal = (
            backend.preferred_refusal if isinstance(backend, PreferredGate) else _never_refused
        )
        self._backend = backend

    def start(self) -> None:
        """Listen on the socket. Raises BindError (nothing left running) when that is not possible."""
        if self._unix.running:
            return
        self.streams.serving()
        if self._call_lines.started:
            self._call_lines = RateLimitedLog(log, name="plugin-call-lines")
        self._call_lines.start()
        try:
            self._unix.start()
        except BaseException:
            self._call_lines.stop()
            raise

    def socket_intact(self) -> bool:
        """Whether the socket file is still the one this server listens on (kubelet deletes it on restart)."""
        return self._unix.intact()

    def stop(self, grace: float = 0.5) -> None:
        if not self._unix.running:
            return
        self.streams.stop()
        self._unix.stop(grace)
        self._call_lines.stop()  # writes the summaries still pending

    def notify(self) -> None:
        """The backend's device list changed: the open ListAndWatch streams send it again."""
        self.streams.notify()

    def _kubelet_stream_ended(self, lived_s: float, lost: bool) -> None:
        if self._on_kubelet_stream_end is not None:
            self._on_kubelet_stream_end(self, lived_s, lost)

    def _device_list(self) -> pb.ListAndWatchResponse:
        return device_list_message(self.backend.devices())

    def parse_or_abort(
        self, message_type: type[M], raw: bytes, context: grpc.ServicerContext, method: str
    ) -> M:
        try:
            return protocol.parse(message_type, raw)
        except protocol.RequestError as exc:
            log.warning("%s %s refused: %s", self.resource_name, method, exc)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise

    def refuse(self, method: CallMethod, context: grpc.ServicerContext, why: str) -> NoReturn:
        """Refuse a call before reading its request (INVALID_ARGUMENT, as call() does); the line is limited
        per resource and method, as such calls come in floods."""
        started = time.perf_counter()
        try:
            self._refused(method, why)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)
        finally:
            self._events.call_answered(
                self.resource_name, method, time.perf_counter() - started, "invalid_argument"
            )

    def _refused(self, method: CallMethod, why: str) -> None:
        if method == "GetPreferredAllocation":  # any client may loop it; kubelet sends one per pod
            key = f"{method} refusals of {self.resource_name}"
            self._call_lines.log(key, logging.WARNING, "%s %s refused: %s", self.resource_name, method, why)
        else:
            log.warning("%s %s refused: %s", self.resource_name, method, why)

    def call(self, method: CallMethod, context: grpc.ServicerContext, fn: Callable[[], T]) -> T:
        """Run one unary call: project errors become INVALID_ARGUMENT, surprises INTERNAL."""
        started = time.perf_counter()
        error: CallError | None = None
        try:
            return fn()
        except (AllocationError, protocol.RequestError) as exc:
            error = "invalid_argument"
            message = shorten(str(exc))
            self._refused(method, message)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
            raise  # abort() raises; this keeps the type checker sure nothing falls through
        except Exception as exc:
            error = "internal"
            log.exception("%s %s failed", self.resource_name, method)
            context.abort(grpc.StatusCode.INTERNAL, shorten(f"{method} failed: {exc}"))
            raise
        finally:
            self._events.call_answered(self.resource_name, method, time.perf_counter() - started, error)


def handlers(server: ResourceServer) -> grpc.GenericRpcHandler[bytes, Message]:
    """The DevicePlugin service of `server`, requests taken as raw bytes."""

    def options(raw: bytes, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        server.parse_or_abort(pb.Empty, raw, context, "GetDevicePluginOptions")
        server.streams.dialled_back()
        return protocol.PLUGIN_OPTIONS

    def list_and_watch(raw: bytes, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        server.parse_or_abort(pb.Empty, raw, context, "ListAndWatch")
        return server.streams.open(context)

    def allocate(raw: bytes, context: grpc.ServicerContext) -> pb.AllocateResponse:
        def answer() -> pb.AllocateResponse:
            requests = protocol.check_allocate(protocol.parse(pb.AllocateRequest, raw), server.device_count)
            return server.backend.allocate(requests)

        return server.call("Allocate", context, answer)

    def preferred(raw: bytes, context: grpc.ServicerContext) -> pb.PreferredAllocationResponse:
        if (refusal := server.preferred_refusal()) is not None:  # before parsing: see PreferredGate
            server.refuse("GetPreferredAllocation", context, shorten(refusal))

        def answer() -> pb.PreferredAllocationResponse:
            request = protocol.parse(pb.PreferredAllocationRequest, raw)
            protocol.check_preferred(request, server.device_count)
            response = pb.PreferredAllocationResponse()
            for c in request.container_requests:
                ids = server.backend.preferred_allocation(
                    list(c.available_deviceIDs), list(c.must_include_deviceIDs), c.allocation_size
                )
                response.container_responses.add(deviceIDs=ids)
            return response

        return server.call("GetPreferredAllocation", context, answer)

    def pre_start(raw: bytes, context: grpc.ServicerContext) -> pb.PreStartContainerResponse:
        server.parse_or_abort(pb.PreStartContainerRequest, raw, context, "PreStartContainer")
        return pb.PreStartContainerResponse()

    def unary(fn: Callable[[bytes, grpc.ServicerContext], Any]) -> grpc.RpcMethodHandler[bytes, Message]:
        # request_deserializer None: the handler gets the bytes as they came off the wire.
        return grpc.unary_unary_rpc_method_handler(fn, response_serializer=_serialize)

    return grpc.method_handlers_generic_handler(
        protocol.SERVICE,
        {
            "GetDevicePluginOptions": unary(options),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                list_and_watch, response_serializer=_serialize
            ),
            "Allocate": unary(allocate),
            "GetPreferredAllocation": unary(preferred),
            "PreStartContainer": unary(pre_start),
        },
    )


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()

"""One kubelet DevicePlugin gRPC server for one resource, on its own unix socket.

The server knows nothing about GPUs: a ResourceBackend answers what devices exist and how to
allocate them; this module serves them as the v1beta1 DevicePlugin service (protocol.py parses and bounds
the requests) and turns project errors into gRPC codes.

Streams never starve unary calls: kubelet reads only the newest ListAndWatch stream of a resource
(each registration opens one), so a new stream ends every older one of the same server. At most one
stream then holds a worker thread for long, and Allocate, which kubelet calls with no deadline, always
finds the other workers free.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf.message import Message

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.errors import AllocationError, DevicePluginError
from nvidia_device_plugin.plugin import protocol
from nvidia_device_plugin.plugin.events import NO_PLUGIN_EVENTS, CallError, CallMethod, PluginEvents

log = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M", bound=Message)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# Worker threads per resource: one for kubelet's stream, the rest for unary calls.
WORKERS = 8
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


class BindError(DevicePluginError):
    """The server cannot listen on its socket path; the message names the path and why."""


@dataclass(frozen=True)
class DeviceState:
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


def device_message(state: DeviceState) -> pb.Device:
    device = pb.Device(ID=state.id, health=HEALTHY if state.healthy else UNHEALTHY)
    if state.numa_node is not None:
        device.topology.nodes.add(ID=state.numa_node)
    return device


def clear_socket_path(path: Path) -> None:
    """Make room for the socket: a stale socket or file is removed, so is an empty directory.

    A non-empty directory is someone's data, never ours to delete: BindError, and the caller retries.
    """
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise BindError(f"cannot inspect {path}: {exc.strerror or exc}") from None
    try:
        if stat.S_ISDIR(mode):
            path.rmdir()
            log.warning("removed the empty directory %s, which stood where the socket must go", path)
        else:
            path.unlink(missing_ok=True)
    except FileNotFoundError:
        return  # removed by someone else meanwhile: the room is made
    except OSError as exc:
        what = "a directory" if stat.S_ISDIR(mode) else "a file"
        raise BindError(
            f"{path} is {what} where the plugin's socket must go and cannot be removed "
            f"({exc.strerror or exc}); remove it"
        ) from None


class ResourceServer:
    """Serves one resource on `socket_path` until stopped. start() may be called again after stop()."""

    def __init__(
        self,
        resource_name: str,
        socket_path: Path,
        backend: ResourceBackend,
        events: PluginEvents = NO_PLUGIN_EVENTS,
        max_workers: int = WORKERS,
    ) -> None:
        self.resource_name = resource_name
        self.socket_path = socket_path
        self._events = events
        self._max_workers = max_workers
        self._grpc: grpc.Server | None = None
        self._inode: int | None = None
        self._changed = threading.Condition()
        self._version = 0
        self._stopping = False
        self._newest_stream = 0  # number of the newest ListAndWatch stream; older ones end
        self._streams: dict[int, grpc.ServicerContext] = {}
        self.backend = backend

    @property
    def backend(self) -> ResourceBackend:
        return self._backend

    @backend.setter
    def backend(self, backend: ResourceBackend) -> None:
        # Bounds the IDs a request may name; counted once here, not on every Allocate.
        self.device_count = len(backend.devices())
        self._backend = backend

    def start(self) -> None:
        """Listen on the socket. Raises BindError (nothing left running) when that is not possible."""
        if self._grpc is not None:
            return
        clear_socket_path(self.socket_path)
        with self._changed:
            self._stopping = False
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self._max_workers, thread_name_prefix=f"grpc-{self.resource_name}"
            ),
            options=[
                ("grpc.max_receive_message_length", protocol.MAX_REQUEST_BYTES),
                ("grpc.max_send_message_length", protocol.MAX_RESPONSE_BYTES),
            ],
            maximum_concurrent_rpcs=MAX_CONCURRENT_CALLS,
        )
        server.add_generic_rpc_handlers((handlers(self),))
        try:
            server.add_insecure_port(f"unix:{self.socket_path}")
            server.start()
            # Kubelet restarting right now may already have deleted the socket we just bound.
            self._inode = self.socket_path.stat().st_ino
        except Exception as exc:
            server.stop(None)
            raise BindError(f"cannot listen on {self.socket_path}: {exc}") from None
        self._grpc = server

    def socket_intact(self) -> bool:
        """Whether the socket file is still the one this server listens on (kubelet deletes it on restart)."""
        try:
            return self._grpc is not None and self.socket_path.stat().st_ino == self._inode
        except OSError:
            return False

    def stop(self, grace: float = 0.5) -> None:
        server, self._grpc = self._grpc, None
        if server is None:
            return
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        server.stop(grace).wait()
        with contextlib.suppress(OSError):
            if self.socket_path.is_socket():
                os.unlink(self.socket_path)

    def notify(self) -> None:
        """The backend's device list changed: the open ListAndWatch stream sends it again now."""
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def stream_devices(self, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        with self._changed:
            self._newest_stream += 1
            number = self._newest_stream
            older = list(self._streams.values())
            self._streams[number] = context
            self._changed.notify_all()
        # Cancelling (not only waking) also frees a stream whose thread is blocked sending to a client
        # that never reads.
        for stale in older:
            stale.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves it unannotated
        if older:
            log.info(
                "ListAndWatch stream opened for %s, ending %d older stream(s)", self.resource_name, len(older)
            )
        else:
            log.info("ListAndWatch stream opened for %s", self.resource_name)
        return self._stream(number, context)

    def _stream(self, number: int, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        def wake() -> None:
            with self._changed:
                self._changed.notify_all()

        def ended() -> bool:
            return self._stopping or number != self._newest_stream or not context.is_active()

        context.add_callback(wake)
        try:
            while True:
                with self._changed:
                    seen = self._version
                    if ended():
                        return
                yield pb.ListAndWatchResponse(devices=[device_message(d) for d in self.backend.devices()])
                with self._changed:
                    while self._version == seen and not ended():
                        self._changed.wait()
                    if ended():
                        return
        finally:
            with self._changed:
                self._streams.pop(number, None)
            log.info("ListAndWatch stream closed for %s", self.resource_name)

    def parse_or_abort(
        self, message_type: type[M], raw: bytes, context: grpc.ServicerContext, method: str
    ) -> M:
        try:
            return protocol.parse(message_type, raw)
        except protocol.RequestError as exc:
            log.warning("%s %s refused: %s", self.resource_name, method, exc)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise

    def call(self, method: CallMethod, context: grpc.ServicerContext, fn: Callable[[], T]) -> T:
        """Run one unary call: project errors become INVALID_ARGUMENT, surprises INTERNAL."""
        started = time.perf_counter()
        error: CallError | None = None
        try:
            return fn()
        except (AllocationError, protocol.RequestError) as exc:
            error = "invalid_argument"
            message = shorten(str(exc))
            log.warning("%s %s refused: %s", self.resource_name, method, message)
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
        return protocol.PLUGIN_OPTIONS

    def list_and_watch(raw: bytes, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        server.parse_or_abort(pb.Empty, raw, context, "ListAndWatch")
        return server.stream_devices(context)

    def allocate(raw: bytes, context: grpc.ServicerContext) -> pb.AllocateResponse:
        def answer() -> pb.AllocateResponse:
            requests = protocol.check_allocate(protocol.parse(pb.AllocateRequest, raw), server.device_count)
            return server.backend.allocate(requests)

        return server.call("Allocate", context, answer)

    def preferred(raw: bytes, context: grpc.ServicerContext) -> pb.PreferredAllocationResponse:
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

"""One kubelet DevicePlugin gRPC server for one resource, on its own unix socket.

The server knows nothing about GPUs: a ResourceBackend answers what devices exist and how to
allocate them; this module only speaks the v1beta1 protocol and turns project errors into gRPC codes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.api.v1beta1 import api_pb2_grpc as pb_grpc
from nvidia_device_plugin.errors import AllocationError

log = logging.getLogger(__name__)

T = TypeVar("T")

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# Kubelet refuses larger messages; a bound here turns a hostile request into a clean error, not an OOM.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# gRPC carries the status message in a header (16 KiB limit); an error quoting a 2 MB device ID would
# arrive as RESOURCE_EXHAUSTED instead of the real code, and flood the log.
MAX_ERROR_CHARS = 1024


def shorten(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... ({len(text)} characters in all)"


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


@dataclass
class ServerHooks:
    """Callbacks for metrics; each is called from gRPC worker threads and must not block."""

    on_allocate: list[Any] = field(default_factory=list)  # f(resource, seconds, error: str | None)
    on_preferred: list[Any] = field(default_factory=list)  # f(resource, seconds, error: str | None)


def device_message(state: DeviceState) -> pb.Device:
    device = pb.Device(ID=state.id, health=HEALTHY if state.healthy else UNHEALTHY)
    if state.numa_node is not None:
        device.topology.nodes.add(ID=state.numa_node)
    return device


class _Servicer(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, server: ResourceServer) -> None:
        self._server = server

    def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> Iterator[pb.ListAndWatchResponse]:
        return self._server.stream_devices(context)

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        requests = [list(c.devices_ids) for c in request.container_requests]
        return self._server.call("Allocate", context, self._server.backend.allocate, requests)

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        def answer() -> pb.PreferredAllocationResponse:
            response = pb.PreferredAllocationResponse()
            for c in request.container_requests:
                ids = self._server.backend.preferred_allocation(
                    list(c.available_deviceIDs), list(c.must_include_deviceIDs), c.allocation_size
                )
                response.container_responses.add(deviceIDs=ids)
            return response

        return self._server.call("GetPreferredAllocation", context, answer)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


class ResourceServer:
    """Serves one resource on `socket_path` until stopped. start() may be called again after stop()."""

    def __init__(
        self,
        resource_name: str,
        socket_path: Path,
        backend: ResourceBackend,
        hooks: ServerHooks | None = None,
        max_workers: int = 8,
    ) -> None:
        self.resource_name = resource_name
        self.socket_path = socket_path
        self.backend = backend
        self.hooks = hooks or ServerHooks()
        self._max_workers = max_workers
        self._grpc: grpc.Server | None = None
        self._inode: int | None = None
        self._changed = threading.Condition()
        self._version = 0
        self._stopping = False

    @property
    def running(self) -> bool:
        return self._grpc is not None

    def start(self) -> None:
        if self._grpc is not None:
            return
        if self.socket_path.exists() or self.socket_path.is_symlink():
            self.socket_path.unlink()  # a stale socket from an earlier run blocks bind()
        with self._changed:
            self._stopping = False
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self._max_workers, thread_name_prefix=f"grpc-{self.resource_name}"
            ),
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        pb_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix:{self.socket_path}")
        server.start()
        self._inode = self.socket_path.stat().st_ino
        self._grpc = server

    def socket_intact(self) -> bool:
        """Whether the socket file is still the one this server listens on (kubelet deletes it on restart)."""
        try:
            return self._grpc is not None and self.socket_path.stat().st_ino == self._inode
        except FileNotFoundError:
            return False

    def stop(self, grace: float = 0.5) -> None:
        server, self._grpc = self._grpc, None
        if server is None:
            return
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        server.stop(grace).wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def notify(self) -> None:
        """The backend's device list changed: every open ListAndWatch stream sends it again now."""
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def stream_devices(self, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        def wake() -> None:
            with self._changed:
                self._changed.notify_all()

        context.add_callback(wake)
        log.info("ListAndWatch stream opened for %s", self.resource_name)
        try:
            while True:
                with self._changed:
                    seen = self._version
                    if self._stopping:
                        return
                yield pb.ListAndWatchResponse(devices=[device_message(d) for d in self.backend.devices()])
                with self._changed:
                    while self._version == seen and not self._stopping and context.is_active():
                        self._changed.wait()
                    if self._stopping or not context.is_active():
                        return
        finally:
            log.info("ListAndWatch stream closed for %s", self.resource_name)

    def call(self, method: str, context: grpc.ServicerContext, fn: Callable[..., T], *args: Any) -> T:
        """Run one unary call: project errors become INVALID_ARGUMENT, surprises INTERNAL."""
        started = time.perf_counter()
        error: str | None = None
        try:
            return fn(*args)
        except AllocationError as exc:
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
            hooks = self.hooks.on_allocate if method == "Allocate" else self.hooks.on_preferred
            for hook in hooks:
                hook(self.resource_name, time.perf_counter() - started, error)

"""The v1beta1 DevicePlugin service as gRPC method handlers, with every request bounded before it is used.

Requests arrive as raw bytes and are parsed here, not by gRPC: an undecodable request then becomes one
log line and INVALID_ARGUMENT instead of gRPC's own traceback, and the limits below are checked on the
parsed message before anything is built from it. gRPC itself refuses messages over MAX_REQUEST_BYTES
(RESOURCE_EXHAUSTED) before any Python object exists. docs/operations.md ("Limits") states them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.errors import DevicePluginError

if TYPE_CHECKING:
    from nvidia_device_plugin.plugin.server import ResourceServer

SERVICE = "v1beta1.DevicePlugin"

# Kubelet's requests are tiny (one container, a few device IDs: well under 64 KiB even for 8 GPUs of
# 800 replicas). 1 MiB keeps the memory a request can pin at a few MiB per call.
MAX_REQUEST_BYTES = 1024 * 1024
# Kubelet sends one container per Allocate and per GetPreferredAllocation; 64 leaves room for any
# future batching without letting a 200,000-container request build 200,000 responses.
MAX_CONTAINER_REQUESTS = 64
# Answers carry device lists (ListAndWatch of a large MIG/replica node) and stay under kubelet's limit.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
# What the plugin tells kubelet it supports, at registration and when asked: preferred allocation, no
# PreStartContainer.
PLUGIN_OPTIONS = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

M = TypeVar("M", bound=Message)


class RequestError(DevicePluginError):
    """A request that is undecodable or over a limit; answered with INVALID_ARGUMENT."""


def parse(message_type: type[M], raw: bytes) -> M:
    try:
        return message_type.FromString(raw)
    except DecodeError as exc:
        raise RequestError(
            f"undecodable {message_type.DESCRIPTOR.name} ({len(raw)} bytes): {exc or 'malformed protobuf'}"
        ) from None


def check_count(what: str, count: int, limit: int) -> None:
    if count > limit:
        raise RequestError(f"{what}: {count} given, at most {limit} accepted")


def check_allocate(request: pb.AllocateRequest, device_count: int) -> list[list[str]]:
    containers = request.container_requests
    check_count("container_requests", len(containers), MAX_CONTAINER_REQUESTS)
    for n, container in enumerate(containers):
        check_count(f"container_requests[{n}].devices_ids", len(container.devices_ids), device_count)
    return [list(c.devices_ids) for c in containers]


def check_preferred(request: pb.PreferredAllocationRequest, device_count: int) -> None:
    containers = request.container_requests
    check_count("container_requests", len(containers), MAX_CONTAINER_REQUESTS)
    for n, c in enumerate(containers):
        check_count(f"container_requests[{n}].available_deviceIDs", len(c.available_deviceIDs), device_count)
        check_count(
            f"container_requests[{n}].must_include_deviceIDs", len(c.must_include_deviceIDs), device_count
        )


def handlers(server: ResourceServer) -> grpc.GenericRpcHandler[bytes, Message]:
    """The DevicePlugin service of `server`, requests taken as raw bytes."""

    def options(raw: bytes, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        server.parse_or_abort(pb.Empty, raw, context, "GetDevicePluginOptions")
        return PLUGIN_OPTIONS

    def list_and_watch(raw: bytes, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        server.parse_or_abort(pb.Empty, raw, context, "ListAndWatch")
        return server.stream_devices(context)

    def allocate(raw: bytes, context: grpc.ServicerContext) -> pb.AllocateResponse:
        def answer() -> pb.AllocateResponse:
            requests = check_allocate(parse(pb.AllocateRequest, raw), server.device_count)
            return server.backend.allocate(requests)

        return server.call("Allocate", context, answer)

    def preferred(raw: bytes, context: grpc.ServicerContext) -> pb.PreferredAllocationResponse:
        def answer() -> pb.PreferredAllocationResponse:
            request = parse(pb.PreferredAllocationRequest, raw)
            check_preferred(request, server.device_count)
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
        SERVICE,
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

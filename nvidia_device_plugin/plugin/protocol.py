"""The v1beta1 DevicePlugin wire protocol: its limits, and every request parsed and bounded before use.

Requests arrive as raw bytes (server.py's handlers take them so) and are parsed here, not by gRPC: an
undecodable request then becomes one log line and INVALID_ARGUMENT instead of gRPC's own traceback, and
the limits below are checked on the parsed message before anything is built from it. gRPC itself refuses
messages over MAX_REQUEST_BYTES (RESOURCE_EXHAUSTED) before any Python object exists. docs/operations.md
("Limits") states them.
"""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.base.errors import DevicePluginError

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

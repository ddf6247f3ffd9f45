"""GetPreferredAllocation calls past the backend's bound are refused cheaply (issue 32, item 9 follow-up):
before the request is parsed, and with the lines about them limited per resource. A flood of refused calls
(3 containers of 2,800 IDs each) used to cost a parse and a log line apiece, which Allocate paid for.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import pytest
from test_plugin_framework import FakeBackend

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.base.logs import RATE_LIMIT_BURST
from nvidia_device_plugin.plugin import protocol
from nvidia_device_plugin.plugin.server import ResourceServer

RESOURCE = "example.com/dev"
BUSY = "GetPreferredAllocation for example.com/dev: 1 computing and 2 waiting already"
SERVER_LOG = "nvidia_device_plugin.plugin.server"
UNDECODABLE = b"\xff\xff\xff"  # no protobuf: parsing it is refused as undecodable


class BusyBackend(FakeBackend):
    """A backend whose GetPreferredAllocation bound is reached while `busy` holds."""

    def __init__(self, ids: Sequence[str]) -> None:
        super().__init__(ids)
        self.busy = True
        self.computed = 0

    def preferred_refusal(self) -> str | None:
        return BUSY if self.busy else None

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        self.computed += 1
        return super().preferred_allocation(available, must_include, size)


@pytest.fixture
def backend() -> BusyBackend:
    return BusyBackend([f"d{n}" for n in range(8)])


@pytest.fixture
def channel(plugin_dir: Path, backend: BusyBackend) -> Iterator[grpc.Channel]:
    server = ResourceServer(RESOURCE, plugin_dir / "dev.sock", backend)
    server.start()
    channel = grpc.insecure_channel(f"unix:{server.socket_path}")
    try:
        yield channel
    finally:
        channel.close()
        server.stop()


def preferred_raw(channel: grpc.Channel, raw: bytes) -> pb.PreferredAllocationResponse:
    call = channel.unary_unary(
        f"/{protocol.SERVICE}/GetPreferredAllocation",
        request_serializer=None,
        response_deserializer=pb.PreferredAllocationResponse.FromString,
    )
    return call(raw, timeout=30)  # type: ignore[no-any-return]


def test_a_call_past_the_bound_is_refused_before_its_request_is_read(
    channel: grpc.Channel, backend: BusyBackend
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        preferred_raw(channel, UNDECODABLE)
    # Today: "undecodable PreferredAllocationRequest" (parsed first). Now: the bound, named.
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert BUSY in (refused.value.details() or "")
    assert backend.computed == 0
    backend.busy = False
    with pytest.raises(grpc.RpcError) as undecodable:
        preferred_raw(channel, UNDECODABLE)
    assert "undecodable" in (undecodable.value.details() or "")
    request = pb.PreferredAllocationRequest(
        container_requests=[pb.ContainerPreferredAllocationRequest(available_deviceIDs=["d1", "d0"])]
    )
    request.container_requests[0].allocation_size = 1
    answer = preferred_raw(channel, request.SerializeToString())
    assert list(answer.container_responses[0].deviceIDs) == ["d0"]


def test_a_flood_of_refused_calls_writes_a_few_lines(
    channel: grpc.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=SERVER_LOG)
    request = pb.PreferredAllocationRequest(
        container_requests=[pb.ContainerPreferredAllocationRequest(available_deviceIDs=["d0"])]
    ).SerializeToString()
    for _ in range(40):
        with pytest.raises(grpc.RpcError):
            preferred_raw(channel, request)
    lines = [r.getMessage() for r in caplog.records if r.name == SERVER_LOG and BUSY in r.getMessage()]
    # Today: one line per refused call (40). Now: a burst; the rest are summed up when the window ends.
    assert 0 < len(lines) <= RATE_LIMIT_BURST, lines

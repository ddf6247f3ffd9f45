"""Kubelet's ListAndWatch stream is never lost silently (issue 23, items 1 and 2).

Another client on the plugin's socket (a `grpcurl` while debugging) must not end kubelet's stream; when
kubelet's stream ends anyway (kubelet closed it, or its disconnect race), the plugin registers again so
kubelet opens a new one; and a registered resource without a live kubelet stream makes the plugin unhealthy
after a grace period. The kubelet stand-in behaves as kubelet does: a stream end marks the devices
Unhealthy and kubelet never dials back by itself.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from test_plugin_framework import FakeBackend

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.api.v1beta1 import api_pb2_grpc as pb_grpc
from nvidia_device_plugin.plugin.manager import PluginManager, ResourceSpec
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.kubelet_standin import kubelet_standin
from support.waiting import eventually

RESOURCE = "example.com/dev"
SOCKET = "fake-0.sock"
DEVICES = [f"d{n}" for n in range(8)]
OTHER_STREAMS = 1  # streams kept open besides kubelet's (docs/operations.md, "Limits")


@pytest.fixture
def ticking(plugin_dir: Path) -> Iterator[KubeletStandIn]:
    """A stand-in whose node status is recomputed every 50 ms (kubelet: every 10 s)."""
    with kubelet_standin(plugin_dir, node_status_interval=0.05) as k:
        yield k


def serve(manager: PluginManager) -> None:
    manager.apply({RESOURCE: ResourceSpec(RESOURCE, SOCKET, FakeBackend(DEVICES))})


def stranger_streams(plugin_dir: Path, count: int) -> tuple[grpc.Channel, list[grpc.RpcContext]]:
    """`count` ListAndWatch streams of a client that is not kubelet, each read up to its first message."""
    channel = grpc.insecure_channel(f"unix:{plugin_dir / SOCKET}")
    stub = pb_grpc.DevicePluginStub(channel)
    streams = []
    for _ in range(count):
        stream = stub.ListAndWatch(pb.Empty())
        next(stream)
        streams.append(stream)
    return channel, streams


def allocatable_after_a_tick(kubelet: KubeletStandIn) -> int:
    assert kubelet.wait_for_ticks(2)
    return kubelet.node_status(RESOURCE)[1]


def _drain(stream: Iterator[pb.ListAndWatchResponse]) -> None:
    with contextlib.suppress(grpc.RpcError):
        for _ in stream:
            pass


@pytest.mark.parametrize("strangers", [1, 12])
def test_another_client_on_the_socket_does_not_end_kubelets_stream(
    plugin_dir: Path, ticking: KubeletStandIn, manager: PluginManager, strangers: int
) -> None:
    serve(manager)
    assert ticking.wait_for_resources([RESOURCE])
    assert allocatable_after_a_tick(ticking) == 8
    registrations = len(ticking.registrations)
    channel, streams = stranger_streams(plugin_dir, strangers)
    try:
        assert allocatable_after_a_tick(ticking) == 8
        assert ticking.disconnects == []
        assert ticking.connected(RESOURCE)
        assert len(ticking.registrations) == registrations  # nothing had to be repaired
        assert ticking.allocate(RESOURCE, [["d1"]]).container_responses[0].envs["DEVICES"] == "d1"
        # Past the bound, the stranger's older streams end, never kubelet's.
        readers = [threading.Thread(target=_drain, args=(s,), daemon=True) for s in streams]
        for reader in readers:
            reader.start()
        assert eventually(lambda: sum(r.is_alive() for r in readers) <= OTHER_STREAMS), (
            "stranger streams piled up"
        )
    finally:
        for stream in streams:
            stream.cancel()  # type: ignore[no-untyped-call]
        channel.close()
    assert ticking.connected(RESOURCE)
    assert manager.health() is None


def test_kubelet_closing_the_stream_is_answered_by_a_new_registration(
    ticking: KubeletStandIn, manager: PluginManager
) -> None:
    serve(manager)
    assert ticking.wait_for_resources([RESOURCE])
    registrations = len(ticking.registrations)
    ticking.close_stream(RESOURCE)  # kubelet marks the devices Unhealthy and never dials back by itself
    assert ticking.wait_for(lambda: ticking.disconnects == [RESOURCE])
    assert ticking.wait_for(lambda: len(ticking.registrations) > registrations), "not registered again"
    assert ticking.wait_for_resources([RESOURCE])
    assert ticking.wait_for(lambda: {d.health for d in ticking.devices(RESOURCE).values()} == {"Healthy"})
    assert allocatable_after_a_tick(ticking) == 8
    assert eventually(lambda: manager.health() is None), manager.health()


@pytest.mark.parametrize("closes", [5])
def test_every_stream_kubelet_closes_is_answered(
    ticking: KubeletStandIn, manager: PluginManager, closes: int
) -> None:
    serve(manager)
    assert ticking.wait_for_resources([RESOURCE])
    for n in range(closes):
        ticking.close_stream(RESOURCE)
        assert ticking.wait_for(lambda n=n: len(ticking.disconnects) == n + 1)
        assert ticking.wait_for_resources([RESOURCE]), f"not back after close {n + 1}"
    assert allocatable_after_a_tick(ticking) == 8


def test_our_own_stop_does_not_register_again(ticking: KubeletStandIn, manager: PluginManager) -> None:
    serve(manager)
    assert ticking.wait_for_resources([RESOURCE])
    registrations = len(ticking.registrations)
    manager.apply({})  # the resource is no longer advertised: its stream ends, nothing comes back
    assert ticking.wait_for(lambda: ticking.disconnects == [RESOURCE])
    assert not ticking.wait_for(lambda: len(ticking.registrations) > registrations, timeout=0.5)


def test_a_registered_resource_without_a_kubelet_stream_fails_health_after_the_grace_period(
    plugin_dir: Path,
) -> None:
    # A kubelet that accepts Register but whose client never opens its stream.
    with kubelet_standin(plugin_dir, watch=False) as kubelet:
        manager = PluginManager(plugin_dir, stream_grace_seconds=0.2)
        manager.start()
        try:
            serve(manager)
            assert kubelet.wait_for(manager.all_registered)
            assert eventually(lambda: "no ListAndWatch stream from kubelet" in (manager.health() or ""))
            assert RESOURCE in (manager.health() or "")
        finally:
            manager.stop()

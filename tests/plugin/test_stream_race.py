"""A stranger's stream cannot take kubelet's place through the registration race (issue 32, item 1), and a
client churning streams does not flood the log (item 8a).

The racing stranger opens its stream while the plugin's Register is in flight: the stand-in's `reject` hook
runs inside Register, before kubelet dials the plugin back, so the stranger's stream is the first one the
plugin sees after it began registering. That is the order the field saw (the stranger's stream came 11 ms
before Register returned); here it is made certain rather than likely. The late stranger opens its stream
after kubelet dialled back and opened its own, before Register returned (the stand-in holds its answer
until the stranger has tried, `register_hold`): the one order the plugin cannot tell from kubelet's own.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from test_plugin_framework import FakeBackend

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.api.v1beta1 import api_pb2_grpc as pb_grpc
from nvidia_device_plugin.base.logs import RATE_LIMIT_BURST
from nvidia_device_plugin.plugin.manager import PluginManager, ResourceSpec
from nvidia_device_plugin.plugin.streams import MAX_REGISTERING_STREAMS
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.waiting import HANG_GUARD_S, eventually, scaled

RESOURCE = "example.com/dev"
SOCKET = "fake-0.sock"
DEVICES = [f"d{n}" for n in range(8)]
STREAMS_LOG = "nvidia_device_plugin.plugin.streams"


class Stranger:
    """A client of the plugin's socket that is not kubelet: opens ListAndWatch streams and holds them."""

    def __init__(self, plugin_dir: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix:{plugin_dir / SOCKET}")
        self.stub = pb_grpc.DevicePluginStub(self.channel)
        self.streams: list[grpc.RpcContext] = []

    def open_stream(self) -> None:
        """One more stream, read up to its first message (so the plugin has taken it in)."""
        stream = self.stub.ListAndWatch(pb.Empty())
        next(stream)
        self.streams.append(stream)

    def try_stream(self) -> bool:
        """open_stream(), False when the plugin refused it (RESOURCE_EXHAUSTED)."""
        try:
            self.open_stream()
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            return False
        return True

    def churn(self, count: int) -> None:
        """`count` streams, each opened, read once and cancelled."""
        for _ in range(count):
            stream = self.stub.ListAndWatch(pb.Empty())
            next(stream)
            stream.cancel()  # type: ignore[no-untyped-call]

    def close(self) -> None:
        for stream in self.streams:
            stream.cancel()  # type: ignore[no-untyped-call]
        self.channel.close()


@pytest.fixture
def stranger(plugin_dir: Path) -> Iterator[Stranger]:
    s = Stranger(plugin_dir)
    yield s
    s.close()


def racing_kubelet(plugin_dir: Path, stranger: Stranger) -> KubeletStandIn:
    """A stand-in (node status every 50 ms) inside whose first Register the stranger opens a stream."""

    def stranger_first(request: pb.RegisterRequest) -> str | None:
        if not stranger.streams:
            stranger.open_stream()
        return None  # Register goes on as usual

    return KubeletStandIn(plugin_dir, reject=stranger_first, node_status_interval=0.05)


@contextlib.contextmanager
def late_stranger_kubelet(
    plugin_dir: Path, stranger: Stranger, opened: list[bool] | None = None, count: int = 1
) -> Iterator[KubeletStandIn]:
    """A stand-in whose first Register answers only after the stranger tried to open `count` streams beside
    kubelet's (whether each opened is appended to `opened`)."""
    tried = threading.Event()

    def until_the_stranger_tried() -> None:
        tried.wait(HANG_GUARD_S)  # set once, so later registrations answer at once

    with KubeletStandIn(
        plugin_dir, register_hold=until_the_stranger_tried, node_status_interval=0.05
    ) as kubelet:

        def open_beside_kubelets() -> None:
            try:
                if kubelet.wait_for_resources([RESOURCE]):  # kubelet's stream delivers: Register not answered
                    for _ in range(count):
                        (opened if opened is not None else []).append(stranger.try_stream())
            finally:
                tried.set()

        opener = threading.Thread(target=open_beside_kubelets, name="late-stranger", daemon=True)
        opener.start()
        yield kubelet
        opener.join()


def serve(manager: PluginManager) -> None:
    manager.apply({RESOURCE: ResourceSpec(RESOURCE, SOCKET, FakeBackend(DEVICES))})


def test_a_stream_opened_while_registering_never_ends_kubelets(
    plugin_dir: Path, stranger: Stranger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=STREAMS_LOG)
    with racing_kubelet(plugin_dir, stranger) as kubelet:
        manager = PluginManager(plugin_dir)
        manager.start()
        try:
            serve(manager)
            assert kubelet.wait_for_resources([RESOURCE])
            assert len(stranger.streams) == 1  # opened while Register was in flight
            # The stranger goes on opening streams: while the registration settles (a few are refused past
            # the bound), then after it.
            for _ in range(3):
                stranger.try_stream()
            assert eventually(lambda: "cannot tell which" in caplog.text or "(kubelet's)" in caplog.text)
            for _ in range(3):
                stranger.open_stream()
            # Today's code took the stranger's first stream for kubelet's and ended kubelet's real one for
            # the stranger's next: kubelet marked every device Unhealthy, and nothing registered again.
            assert not kubelet.wait_for(lambda: bool(kubelet.disconnects), timeout=1.0), kubelet.disconnects
            assert kubelet.connected(RESOURCE)
            assert kubelet.wait_for_ticks(2)
            assert kubelet.node_status(RESOURCE)[1] == len(DEVICES)
            # The stranger's stream came before kubelet dialled back: kubelet's own is known for sure.
            assert eventually(lambda: manager.health() is None), manager.health()
        finally:
            manager.stop()


def test_health_fails_when_the_plugin_cannot_tell_kubelets_stream(
    plugin_dir: Path, stranger: Stranger
) -> None:
    with late_stranger_kubelet(plugin_dir, stranger) as kubelet:
        manager = PluginManager(plugin_dir, stream_grace_seconds=0.2)
        manager.start()
        try:
            serve(manager)
            assert kubelet.wait_for(manager.all_registered, timeout=scaled(10))
            assert len(stranger.streams) == 1
            # Two streams opened after kubelet dialled back and before it answered: which is kubelet's cannot
            # be known, so the liveness probe says so once the grace period is over (today: healthy).
            assert eventually(lambda: "cannot tell whether kubelet holds" in (manager.health() or "")), (
                manager.health()
            )
            assert RESOURCE in (manager.health() or "")
        finally:
            manager.stop()


def test_once_every_stream_that_may_be_kubelets_ended_the_plugin_registers_again(
    plugin_dir: Path, stranger: Stranger
) -> None:
    with late_stranger_kubelet(plugin_dir, stranger) as kubelet:
        manager = PluginManager(plugin_dir, stream_grace_seconds=0.2)
        manager.start()
        try:
            serve(manager)
            assert eventually(lambda: "cannot tell" in (manager.health() or "")), manager.health()
            assert kubelet.connected(RESOURCE) and kubelet.disconnects == []
            registrations = len(kubelet.registrations)
            stranger.close()
            kubelet.close_stream(RESOURCE)  # kubelet's stream ends too: none that may be kubelet's is left
            assert kubelet.wait_for(lambda: len(kubelet.registrations) > registrations, timeout=scaled(10)), (
                "not registered again"
            )
            assert kubelet.wait_for(manager.all_registered, timeout=scaled(10))
            # The new registration had no stranger racing it: its one stream is kubelet's, and health is back.
            assert eventually(lambda: manager.health() is None), manager.health()
            assert kubelet.wait_for(
                lambda: {d.health for d in kubelet.devices(RESOURCE).values()} == {"Healthy"}
            )
        finally:
            manager.stop()


def test_a_client_churning_streams_does_not_flood_the_log(
    plugin_dir: Path, kubelet: KubeletStandIn, stranger: Stranger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=STREAMS_LOG)
    manager = PluginManager(plugin_dir)
    manager.start()
    try:
        serve(manager)
        assert kubelet.wait_for_resources([RESOURCE])
        assert eventually(lambda: "(kubelet's)" in caplog.text), "kubelet's stream was never told apart"
        stranger.churn(40)
        assert kubelet.connected(RESOURCE)
    finally:
        manager.stop()  # writes the summaries still pending
    lines = [r.getMessage() for r in caplog.records if r.name == STREAMS_LOG]
    about_others = [m for m in lines if m.startswith("ListAndWatch stream") and "(kubelet's)" not in m]
    # Today: two lines per stream (80). Now: a burst, then one summary saying how many were left out.
    assert len(about_others) <= RATE_LIMIT_BURST, about_others
    summaries = [m for m in lines if "left out" in m and RESOURCE in m]
    assert summaries, lines


def test_streams_opened_while_registering_are_bounded(plugin_dir: Path, stranger: Stranger) -> None:
    opened: list[bool] = []
    count = MAX_REGISTERING_STREAMS + 1
    with late_stranger_kubelet(plugin_dir, stranger, opened, count=count) as kubelet:
        manager = PluginManager(plugin_dir)
        manager.start()
        try:
            serve(manager)
            assert kubelet.wait_for(manager.all_registered, timeout=scaled(10))
            # Kubelet's and MAX_REGISTERING_STREAMS - 1 more are kept while Register is in flight; the rest
            # are refused at once, so the workers Allocate needs stay free.
            assert eventually(lambda: len(opened) == count)
            assert opened == [True] * (MAX_REGISTERING_STREAMS - 1) + [False, False]
            assert kubelet.allocate(RESOURCE, [["d1"]]).container_responses[0].envs["DEVICES"] == "d1"
            assert kubelet.connected(RESOURCE) and kubelet.disconnects == []
        finally:
            manager.stop()


@pytest.mark.parametrize("restarts", [3])
def test_a_client_opening_streams_every_few_ms_across_kubelet_restarts_never_takes_kubelets_place(
    plugin_dir: Path, restarts: int
) -> None:
    # The field's case: a stream every few milliseconds, each on its own connection and read, while kubelet
    # restarts. Kubelet's stream may land just after its answer to Register, so a stranger's can come first
    # either side of the answer; kubelet must keep its stream every time.
    channel = grpc.insecure_channel(f"unix:{plugin_dir / SOCKET}")  # reconnects after each restart
    stub = pb_grpc.DevicePluginStub(channel)
    stop = threading.Event()
    answered = threading.Event()  # the plugin has taken in one of the client's streams

    def open_streams() -> None:
        while not stop.wait(0.005):
            stream = stub.ListAndWatch(pb.Empty())
            threading.Thread(target=_drain, args=(stream, answered), daemon=True).start()

    with KubeletStandIn(plugin_dir, node_status_interval=0.05) as kubelet:
        manager = PluginManager(plugin_dir, stream_grace_seconds=0.2)
        manager.start()
        opener = threading.Thread(target=open_streams, name="stream-opener", daemon=True)
        try:
            serve(manager)
            assert kubelet.wait_for_resources([RESOURCE])
            opener.start()
            # The client is at work before kubelet restarts: its very first stream landing in the
            # registration window after a restart, with none before it, is the one order the plugin
            # cannot tell from kubelet's (plugin/streams.py); on a loaded machine it sometimes did.
            assert answered.wait(scaled(10)), "the client's streams were never answered"
            for n in range(restarts):
                kubelet.restart()
                assert kubelet.wait_for_resources([RESOURCE]), f"not back after restart {n + 1}"
                disconnects = len(kubelet.disconnects)
                assert kubelet.wait_for_ticks(2)
                assert not kubelet.wait_for(
                    lambda d=disconnects: len(kubelet.disconnects) > d, timeout=1.0
                ), f"kubelet lost its stream after restart {n + 1}"
                assert kubelet.node_status(RESOURCE)[1] == len(DEVICES), f"devices lost after restart {n + 1}"
            # Whichever stream is kubelet's is either known or said to be unknown, never wrongly taken.
            assert eventually(
                lambda: manager.health() is None or "cannot tell" in (manager.health() or "")
            ), manager.health()
        finally:
            stop.set()
            if opener.is_alive() or opener.ident is not None:
                opener.join()
            manager.stop()
            channel.close()


def _drain(stream: Iterator[pb.ListAndWatchResponse], answered: threading.Event) -> None:
    with contextlib.suppress(grpc.RpcError, ValueError):
        for _ in stream:
            answered.set()

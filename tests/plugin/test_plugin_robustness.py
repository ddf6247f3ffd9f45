"""The framework holds against unread streams, slow kubelets, restart storms, a vanishing directory and
oversized or undecodable requests (issue 10, items 1, 2, 4 and 11).

Everything goes through the real unix sockets: the kubelet stand-in on one side, raw gRPC clients where
kubelet would never send what the test sends. Soak-sized variants run under `make soak`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from test_plugin_framework import FakeBackend

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.api.v1beta1 import api_pb2_grpc as pb_grpc
from nvidia_device_plugin.plugin.manager import PluginManager, ResourceSpec
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU, start_daemon
from support.kubelet_standin import kubelet_standin
from support.markers import soak
from support.threads import DIRECTORY_WATCH, counted_threads, threads_named
from support.waiting import eventually, scaled

RESOURCE = "example.com/dev"
SOCKET = "fake-0.sock"
DEVICES = [f"d{n}" for n in range(8)]


def serve(manager: PluginManager) -> None:
    manager.apply({RESOURCE: ResourceSpec(RESOURCE, SOCKET, FakeBackend(DEVICES))})


@pytest.fixture
def channel(plugin_dir: Path) -> Iterator[grpc.Channel]:
    """A client of the plugin's socket that is not the kubelet stand-in."""
    with grpc.insecure_channel(f"unix:{plugin_dir / SOCKET}") as c:
        yield c


def _drain(stream: Iterator[pb.ListAndWatchResponse]) -> None:
    with contextlib.suppress(grpc.RpcError):
        for _ in stream:
            pass


def allocate_answers(kubelet: KubeletStandIn) -> bool:
    response = kubelet.allocate(RESOURCE, [["d1"]], timeout=scaled(10))
    return response.container_responses[0].envs["DEVICES"] == "d1"


# ---- item 1: streams never starve unary calls ----------------------------------------------------------


@pytest.mark.parametrize("rounds", [1, soak(150)])
def test_unread_streams_never_starve_allocate(
    kubelet: KubeletStandIn, manager: PluginManager, channel: grpc.Channel, rounds: int
) -> None:
    serve(manager)
    assert kubelet.wait_for_resources([RESOURCE])
    assert kubelet.wait_for(lambda: threads_named(DIRECTORY_WATCH) != [])  # its threads in both counts
    stub = pb_grpc.DevicePluginStub(channel)
    threads_before = counted_threads()
    for _ in range(rounds):
        # More streams than the server has workers, none of them ever read.
        streams = [stub.ListAndWatch(pb.Empty()) for _ in range(12)]
        assert allocate_answers(kubelet)
        # Only the newest stream stays besides kubelet's: every older one has ended, kubelet's has not (a
        # client sees the end of a stream only once it has read what was sent before it, so read them now).
        readers = [threading.Thread(target=_drain, args=(s,), daemon=True) for s in streams]
        for reader in readers:
            reader.start()
        assert eventually(lambda rs=readers: sum(r.is_alive() for r in rs) <= 1), "older streams kept open"
        # Ended cleanly (OK) when it was waiting for a change, CANCELLED when it was mid-send.
        ends = {s.code() for s in streams if s.done()}
        assert ends <= {grpc.StatusCode.OK, grpc.StatusCode.CANCELLED}, ends
        for s in streams:
            s.cancel()
        for reader in readers:
            reader.join()
    # Kubelet's stream was never among them (issue 23 item 1: a stranger ending it left kubelet at 0).
    assert kubelet.connected(RESOURCE) and kubelet.disconnects == []
    # Kubelet's next registration opens the stream it uses, and it works.
    kubelet.restart()
    assert kubelet.wait_for_resources([RESOURCE])
    assert allocate_answers(kubelet)
    assert eventually(lambda: counted_threads() <= threads_before + 4)


def test_a_new_stream_gets_the_device_list_and_updates(
    kubelet: KubeletStandIn, manager: PluginManager, channel: grpc.Channel
) -> None:
    serve(manager)
    assert kubelet.wait_for_resources([RESOURCE])
    stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty())
    try:
        first = next(stream)
        assert sorted(d.ID for d in first.devices) == DEVICES
        manager.notify(RESOURCE)
        assert sorted(d.ID for d in next(stream).devices) == DEVICES
    finally:
        stream.cancel()


def test_kubelet_answering_register_slowly_gets_one_registration(plugin_dir: Path) -> None:
    # Kubelet dials back and opens the stream, then takes 2.5 s to answer Register.
    with kubelet_standin(plugin_dir, register_hold=lambda: time.sleep(2.5)) as kubelet:
        manager = PluginManager(plugin_dir)
        manager.start()
        try:
            serve(manager)
            assert kubelet.wait_for(manager.all_registered, timeout=scaled(30))
            assert allocate_answers(kubelet)
            assert len(kubelet.registrations) == 1
            assert kubelet.superseded == []
            assert manager.health() is None
        finally:
            manager.stop()


def test_register_timing_out_does_not_pile_up_streams(plugin_dir: Path, channel: grpc.Channel) -> None:
    # Every Register times out on the plugin's side although kubelet registers it each time and opens
    # a stream each time: the plugin must end the older streams past its bound, so Allocate keeps
    # answering. (Asked on the plugin's socket directly: each older stream ended makes kubelet disconnect
    # its current client, so kubelet's own endpoint may be closed at any moment here.)
    with kubelet_standin(plugin_dir, register_hold=lambda: time.sleep(0.6)) as kubelet:
        manager = PluginManager(plugin_dir, max_retry_seconds=0.1, register_timeout_seconds=0.2)
        manager.start()
        try:
            serve(manager)
            assert kubelet.wait_for(lambda: len(kubelet.registrations) >= 12, timeout=scaled(60))
            answer = pb_grpc.DevicePluginStub(channel).Allocate(containers(1), timeout=scaled(10))
            assert answer.container_responses[0].envs["DEVICES"] == "d0"
            assert not manager.all_registered()
            assert "DEADLINE_EXCEEDED" in (manager.health() or "")
            # Superseded endpoints drop out of the list as their streams end; a pile-up would keep them.
            assert kubelet.wait_for(lambda: len(kubelet.superseded) <= 2, timeout=scaled(10)), len(
                kubelet.superseded
            )
        finally:
            manager.stop()


# ---- item 2: supervised registration -------------------------------------------------------------------


@pytest.mark.parametrize("restarts", [30, soak(1000)])
def test_back_to_back_kubelet_restarts_never_kill_the_registrar(
    kubelet: KubeletStandIn, manager: PluginManager, restarts: int
) -> None:
    serve(manager)
    assert kubelet.wait_for_resources([RESOURCE])
    for _ in range(restarts):
        kubelet.restart()  # no waiting in between: the plugin rebinds while kubelet wipes again
    assert kubelet.wait_for_resources([RESOURCE], timeout=scaled(20))
    assert eventually(lambda: manager.health() is None, timeout=scaled(20)), manager.health()
    assert allocate_answers(kubelet)
    kubelet.restart()  # and the registrar still answers the next ordinary restart
    assert kubelet.wait_for_resources([RESOURCE])
    assert "plugin-registrar" in {t.name for t in threading.enumerate()}


def removed(directory: Path) -> bool:
    """`rm -rf` once: False when the plugin bound its socket again between the listing and the rmdir."""
    with contextlib.suppress(OSError):
        shutil.rmtree(directory)
    return not directory.exists()


def test_deleted_and_recreated_plugin_directory_is_watched_again(
    plugin_dir: Path, kubelet: KubeletStandIn, manager: PluginManager
) -> None:
    serve(manager)
    assert kubelet.wait_for_resources([RESOURCE])
    kubelet.stop()
    assert eventually(lambda: removed(plugin_dir)), sorted(os.listdir(plugin_dir))
    assert eventually(lambda: "does not exist" in (manager.health() or "")), manager.health()
    plugin_dir.mkdir()
    kubelet.start()
    assert kubelet.wait_for_resources([RESOURCE], timeout=scaled(20))
    assert eventually(lambda: manager.health() is None), manager.health()
    # The watch is back: a kubelet restart is seen and answered as before.
    registrations = len(kubelet.registrations)
    kubelet.restart()
    assert kubelet.wait_for_resources([RESOURCE])
    assert len(kubelet.registrations) > registrations
    assert allocate_answers(kubelet)


def test_directory_where_the_socket_goes_is_an_error_retried_until_removed(
    plugin_dir: Path, kubelet: KubeletStandIn, manager: PluginManager, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = plugin_dir / SOCKET
    blocker.mkdir()
    (blocker / "data").write_text("not ours to delete\n")
    serve(manager)  # must not raise
    assert eventually(lambda: str(blocker) in (manager.health() or "")), manager.health()
    assert "directory" in (manager.health() or "")
    assert (blocker / "data").exists()
    # The operator clears it; the registrar may remove the empty directory first, and may even have bound
    # its socket there already (NotADirectoryError).
    (blocker / "data").unlink()
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        blocker.rmdir()
    assert kubelet.wait_for_resources([RESOURCE])
    assert eventually(lambda: manager.health() is None), manager.health()
    # The registrar may remove the emptied directory itself (one more, different line); the refusal is
    # what must be logged once.
    lines = [
        r for r in caplog.records if str(blocker) in r.getMessage() and "cannot be removed" in r.getMessage()
    ]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].exc_info is None


def test_empty_directory_where_the_socket_goes_is_removed(
    plugin_dir: Path, kubelet: KubeletStandIn, manager: PluginManager, caplog: pytest.LogCaptureFixture
) -> None:
    (plugin_dir / SOCKET).mkdir()
    serve(manager)
    assert kubelet.wait_for_resources([RESOURCE])
    assert (plugin_dir / SOCKET).is_socket()
    assert "removed the empty directory" in caplog.text


def test_health_names_what_is_missing(plugin_dir: Path) -> None:
    manager = PluginManager(plugin_dir)
    manager.start()
    try:
        assert manager.health() is None  # alive, nothing to serve yet
        serve(manager)
        reason = manager.health() or ""
        assert RESOURCE in reason and "kubelet" in reason
        with kubelet_standin(plugin_dir) as kubelet:
            assert kubelet.wait_for_resources([RESOURCE])
            assert eventually(lambda: manager.health() is None), manager.health()
    finally:
        manager.stop()
    assert "not running" in (manager.health() or "")


# ---- item 4: bounded requests --------------------------------------------------------------------------


def containers(count: int, ids_each: int = 1) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=["d0"] * ids_each)] * count
    )


@pytest.mark.parametrize(
    ("request_", "code", "needle"),
    [
        (containers(65), grpc.StatusCode.INVALID_ARGUMENT, "container_requests: 65 given, at most 64"),
        (containers(20_000), grpc.StatusCode.INVALID_ARGUMENT, "at most 64"),
        (containers(1, 9), grpc.StatusCode.INVALID_ARGUMENT, "devices_ids: 9 given, at most 8"),
        # ~200,000 containers, 8.8 MB: refused by the transport before one is parsed.
        (containers(200_000, 4), grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
    ],
    ids=["65 containers", "20,000 containers", "more IDs than devices", "200,000 containers"],
)
def test_oversized_allocate_is_refused_and_serving_goes_on(
    kubelet: KubeletStandIn,
    manager: PluginManager,
    channel: grpc.Channel,
    request_: pb.AllocateRequest,
    code: grpc.StatusCode,
    needle: str,
) -> None:
    serve(manager)
    assert kubelet.wait_for_resources([RESOURCE])
    with pytest.raises(grpc.RpcError) as err:
        pb_grpc.DevicePluginStub(channel).Allocate(request_, timeout=scaled(30))
    assert err.value.code() == code, err.value.details()
    assert needle in (err.value.details() or "")
    assert allocate_answers(kubelet)


def test_oversized_preferred_allocation_is_refused(
    kubelet: KubeletStandIn, manager: PluginManager, channel: grpc.Channel
) -> None:
    serve(manager)
    assert kubelet.wait_for_resources([RESOURCE])
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=DEVICES * 2, allocation_size=1)
        ]
    )
    with pytest.raises(grpc.RpcError) as err:
        pb_grpc.DevicePluginStub(channel).GetPreferredAllocation(request, timeout=scaled(10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "available_deviceIDs: 16 given, at most 8" in (err.value.details() or "")
    assert kubelet.preferred(RESOURCE, DEVICES, [], 2) == ["d0", "d1"]


# ---- item 11: one line per undecodable request ---------------------------------------------------------


@pytest.mark.parametrize(
    "method", ["Allocate", "GetPreferredAllocation", "ListAndWatch", "PreStartContainer"]
)
def test_undecodable_request_is_one_log_line_and_invalid_argument(
    kubelet: KubeletStandIn,
    manager: PluginManager,
    channel: grpc.Channel,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    method: str,
) -> None:
    serve(manager)
    assert kubelet.wait_for_resources([RESOURCE])
    capfd.readouterr()
    caplog.clear()
    garbage = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, a length that runs far past the end
    path = f"/v1beta1.DevicePlugin/{method}"
    with pytest.raises(grpc.RpcError) as err:
        if method == "ListAndWatch":
            list(channel.unary_stream(path)(garbage, timeout=scaled(10)))
        else:
            channel.unary_unary(path)(garbage, timeout=scaled(10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "undecodable" in (err.value.details() or "")
    lines = [r for r in caplog.records if "undecodable" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert not [r for r in caplog.records if r.name.startswith("grpc")]
    assert "Traceback" not in capfd.readouterr().err
    assert allocate_answers(kubelet)


def test_memory_stays_bounded_under_oversized_requests(
    kubelet: KubeletStandIn, manager: PluginManager, channel: grpc.Channel
) -> None:
    serve(manager)
    assert kubelet.wait_for_resources([RESOURCE])
    raw = containers(20_000).SerializeToString()  # just under 1 MiB: parsed, then refused by count
    call = channel.unary_unary("/v1beta1.DevicePlugin/Allocate")
    rss_before = _rss_kib()
    for _ in range(50):
        with pytest.raises(grpc.RpcError) as err:
            call(raw, timeout=scaled(10))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _rss_kib() - rss_before < 100 * 1024, "50 refused requests grew RSS by over 100 MiB"
    assert allocate_answers(kubelet)


def _rss_kib() -> int:
    with open(f"/proc/{os.getpid()}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


def test_register_logs_through_the_manager_logger(
    kubelet: KubeletStandIn, manager: PluginManager, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nvidia_device_plugin")
    serve(manager)
    assert kubelet.wait_for_resources([RESOURCE])
    # The registered flag is set just before the line is logged: wait for the line itself.
    assert kubelet.wait_for(
        lambda: any(
            r.name == "nvidia_device_plugin.plugin.manager" and "registered" in r.getMessage()
            for r in caplog.records
        )
    )


def test_daemon_starts_with_a_directory_where_its_socket_goes(
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    # Used to end start-up with a traceback; now the daemon starts, says why it cannot serve, and retries.
    blocker = plugin_dir / "nvidia-gpu.sock"
    blocker.mkdir()
    (blocker / "data").write_text("x\n")
    daemon = start_daemon(plugin_dir)
    try:
        assert eventually(lambda: str(blocker) in (daemon.manager.health() or "")), daemon.manager.health()
        shutil.rmtree(blocker)
        assert kubelet.wait_for_resources([GPU], timeout=scaled(20))
        assert eventually(lambda: daemon.manager.health() is None), daemon.manager.health()
    finally:
        daemon.stop()

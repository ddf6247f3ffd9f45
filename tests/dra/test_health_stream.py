"""Kubelet's DRA health stream (dra-health v1, v1beta1 and v1alpha1 NodeWatchResources) through the plugin's
real socket: a GPU goes Unhealthy on an injected XID and Healthy again on recovery (in every version), the
full state on connect, the same causes as the taints, a bound on open streams, and a client that goes away
gives its thread back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2, text_format
from google.protobuf.descriptor import FileDescriptor

from nvidia_device_plugin.api.dra_health.v1 import api_pb2 as v1_pb
from nvidia_device_plugin.api.dra_health.v1alpha1 import api_pb2 as health_pb
from nvidia_device_plugin.api.dra_health.v1beta1 import api_pb2 as v1beta1_pb
from nvidia_device_plugin.config.dra import Dra
from nvidia_device_plugin.config.v1 import Config, Recovery
from nvidia_device_plugin.config.v1 import Health as HealthConfig
from nvidia_device_plugin.configmanager.nodewatch import api_client_for
from nvidia_device_plugin.daemons.run import Daemon
from nvidia_device_plugin.dra.device_health import (
    CHECKS_DISABLED,
    DeviceHealthReport,
    HealthStatus,
    device_health,
)
from nvidia_device_plugin.dra.kubelet.health_stream import (
    HEALTH_CHECK_TIMEOUT_S,
    MAX_MESSAGE_CHARS,
    MAX_STREAMS,
    SERVICES,
    HealthFeed,
)
from nvidia_device_plugin.dra.kubelet.plugin import WORKERS
from nvidia_device_plugin.dra.names import DraDevice
from nvidia_device_plugin.dra.options import DraOptions
from nvidia_device_plugin.events import CauseKind, HealthCause
from nvidia_device_plugin.health.policy import xid_cause
from nvidia_device_plugin.health.registry import Verdict
from nvidia_device_plugin.standins.dra_health import HealthWatch, pick_health_service
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import simulator, start_daemon
from support.dra_kubelet import NODE as STANDIN_NODE
from support.dra_kubelet import DraKubeletStandIn, DraNode, dra_node
from support.fake_apiserver import NODE, FakeResourceSliceApi
from support.podresources_standin import PodResourcesStandIn
from support.waiting import HANG_GUARD_S, wait_for

SINCE = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@contextmanager
def dra_daemon(plugin_dir: Path, config: Config) -> Iterator[Daemon]:
    """The whole daemon in the DRA mode on a simulated dgx-a100, every GPU to DRA."""
    with FakeResourceSliceApi() as api, PodResourcesStandIn(plugin_dir / "pod-resources.sock"):
        options = DraOptions(
            node_name=NODE,
            pod_resources_socket=plugin_dir / "pod-resources.sock",
            kubelet_plugins_dir=plugin_dir / "plugins",
            kubelet_registry_dir=plugin_dir / "plugins_registry",
            api_client=lambda: api_client_for(api.url),
            poll_interval_s=0.01,
        )
        daemon = start_daemon(plugin_dir, "dgx-a100", lambda: config, dra=options)
        try:
            yield daemon
        finally:
            daemon.stop()


def _health(watch: HealthWatch, device: str) -> str | None:
    entry = watch.latest().get((NODE, device))
    return entry.health if entry is not None else None


@pytest.mark.parametrize("service", SERVICES)
def test_an_xid_turns_the_gpu_unhealthy_on_the_stream_and_recovery_healthy_again(
    plugin_dir: Path, kubelet: KubeletStandIn, service: str
) -> None:
    # The grace holds the late client's stream, which must open while GPU 2 is still unhealthy.
    recovery = Recovery(enabled=True, grace_period_seconds=2.0)
    config = Config(dra=Dra(enabled=True, gpus="all"), health=HealthConfig(recovery=recovery))
    with dra_daemon(plugin_dir, config) as daemon:
        endpoint = plugin_dir / "plugins" / "gpu.nvidia.com" / "dra.sock"
        wait_for(endpoint.is_socket, "the DRA endpoint")
        with HealthWatch(endpoint, service) as watch:
            assert watch.wait_for(lambda w: _health(w, "gpu-7") == "HEALTHY", HANG_GUARD_S)
            first = watch.latest()
            assert all(e.health == "HEALTHY" and e.message == "" for e in first.values()), first
            assert {e.health_check_timeout_seconds for e in first.values()} == {HEALTH_CHECK_TIMEOUT_S}
            assert {d for _, d in first} >= {f"gpu-{i}" for i in range(8)}

            simulator(daemon).inject_xid(2, 79)
            assert watch.wait_for(lambda w: _health(w, "gpu-2") == "UNHEALTHY", HANG_GUARD_S)
            sick = watch.latest()
            assert "XID 79" in sick[(NODE, "gpu-2")].message
            assert [d for (_, d), e in sick.items() if e.health != "HEALTHY"] == ["gpu-2"]

            with HealthWatch(endpoint, service) as late:  # a new client hears the whole state at once
                assert late.wait_for(lambda w: bool(w.messages), HANG_GUARD_S)
                assert late.messages[0][(NODE, "gpu-2")].health == "UNHEALTHY"

            assert watch.wait_for(lambda w: _health(w, "gpu-2") == "HEALTHY", HANG_GUARD_S)
            assert all(e.health == "HEALTHY" for e in watch.latest().values())
        assert watch.error is None  # closed by us, not ended by the plugin


@pytest.fixture
def dra() -> Iterator[DraNode]:
    yield from dra_node()


def _reports(dra: DraNode) -> tuple[DeviceHealthReport, ...]:
    return device_health(dra.node.devices, {}, STANDIN_NODE)


def test_the_registration_lists_the_health_services_and_the_endpoint_serves_the_one_kubelet_picks(
    dra: DraNode,
) -> None:
    plugin = dra.plugin()
    plugin.health_feed.update(_reports(dra))
    with DraKubeletStandIn(dra.registry_dir) as kubelet:
        driver = kubelet.driver()
        service = pick_health_service(driver.info.supported_versions)
        assert service == "v1.DRAResourceHealth"  # kubelet 1.37+ prefers v1
        assert pick_health_service(["v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"]) == (
            "v1alpha1.DRAResourceHealth"  # a kubelet's choice where only v1alpha1 is listed
        )
        with HealthWatch(Path(driver.info.endpoint), service) as watch:
            assert watch.wait_for(lambda w: bool(w.messages), HANG_GUARD_S)
            assert set(watch.messages[0]) == {(STANDIN_NODE, name) for name in dra.node.devices}


def test_nothing_is_sent_before_the_first_update_then_the_full_state(dra: DraNode) -> None:
    plugin = dra.plugin()
    with HealthWatch(plugin.endpoint) as watch:
        wait_for(lambda: plugin.health_feed.streams == 1, "the stream to open")
        assert watch.messages == []
        plugin.health_feed.update(())  # no device served (every GPU with the device plugin): said so
        assert watch.wait_for(lambda w: len(w.messages) == 1, HANG_GUARD_S)
        assert watch.messages == [{}]
        plugin.health_feed.update(_reports(dra))
        assert watch.wait_for(lambda w: len(w.messages) == 2, HANG_GUARD_S)
        assert len(watch.messages[1]) == len(dra.node.devices)


def test_clients_that_go_away_give_their_threads_back_and_open_streams_are_bounded(dra: DraNode) -> None:
    plugin = dra.plugin(health_resend_interval_s=3600.0)  # a stream ends on its client's going, not later
    feed = plugin.health_feed
    feed.update(_reports(dra))
    for _ in range(WORKERS + MAX_STREAMS + 2):  # more than the server has threads, one after another
        with HealthWatch(plugin.endpoint) as watch:
            assert watch.wait_for(lambda w: bool(w.messages), HANG_GUARD_S)
        wait_for(lambda: feed.streams == 0, "the stream's handler to return")
    watches = [HealthWatch(plugin.endpoint) for _ in range(MAX_STREAMS)]
    try:
        for watch in watches:
            assert watch.wait_for(lambda w: bool(w.messages), HANG_GUARD_S)
        with HealthWatch(plugin.endpoint) as extra:
            assert extra.wait_for(lambda w: w.ended, HANG_GUARD_S)
            assert extra.error is grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        for watch in watches:
            watch.close()
    wait_for(lambda: feed.streams == 0, "every stream's handler to return")


def test_stopping_the_plugin_ends_its_open_streams(dra: DraNode) -> None:
    plugin = dra.plugin()
    plugin.health_feed.update(_reports(dra))
    with HealthWatch(plugin.endpoint) as watch:
        assert watch.wait_for(lambda w: bool(w.messages), HANG_GUARD_S)
        plugin.stop()
        assert watch.wait_for(lambda w: w.ended, HANG_GUARD_S)
    assert plugin.health_feed.streams == 0


@pytest.fixture
def mig_devices() -> Iterator[dict[str, DraDevice]]:
    for node in dra_node("a100-mig-mixed"):
        yield dict(node.node.devices)


def test_a_gpu_verdict_takes_its_mig_devices_down_and_a_mig_verdict_only_the_mig(
    mig_devices: dict[str, DraDevice],
) -> None:
    devices = mig_devices
    mig = next(d for d in devices.values() if d.mig is not None)
    on_gpu = {n for n, d in devices.items() if d.gpu.uuid == mig.gpu.uuid}
    assert mig.name in on_gpu and len(on_gpu) > 1
    cause = xid_cause(79)
    reports = {r.device: r for r in device_health(devices, {mig.gpu.uuid: Verdict(cause, SINCE)}, "pool-a")}
    for name in on_gpu:
        assert reports[name] == DeviceHealthReport(
            "pool-a", name, HealthStatus.UNHEALTHY, cause.message, SINCE
        )
    assert {reports[n].status for n in devices if n not in on_gpu} == {HealthStatus.HEALTHY}
    reports = {r.device: r for r in device_health(devices, {mig.uuid: Verdict(cause, SINCE)}, "pool-a")}
    assert [n for n, r in reports.items() if r.status is not HealthStatus.HEALTHY] == [mig.name]


def test_health_checks_off_report_unknown_but_a_verdict_still_unhealthy(dra: DraNode) -> None:
    devices = dra.node.devices
    lost = HealthCause(CauseKind.LOST_AT_START_UP, "GPU lost at start-up")
    first = next(iter(devices.values()))
    reports = device_health(devices, {first.gpu.uuid: Verdict(lost, SINCE)}, "pool-a", checks_disabled=True)
    by_status = {r.device: (r.status, r.message) for r in reports}
    assert by_status[first.name] == (HealthStatus.UNHEALTHY, "GPU lost at start-up")
    assert {v for n, v in by_status.items() if devices[n].gpu.uuid != first.gpu.uuid} == {
        (HealthStatus.UNKNOWN, CHECKS_DISABLED)
    }


def test_the_feed_resends_the_same_state_and_stamps_a_status_when_it_began() -> None:
    now = [1000.0]
    feed = HealthFeed(clock=lambda: now[0])
    healthy = DeviceHealthReport("p", "gpu-0", HealthStatus.HEALTHY)
    long_cause = "x" * 5000
    sick = DeviceHealthReport("p", "gpu-1", HealthStatus.UNHEALTHY, long_cause, SINCE)
    assert feed.update([healthy, sick])
    assert not feed.update([healthy, sick])  # equal reports: no new version, no message
    step = feed.next_message(0, lambda: True, 0.0)
    assert step is not None
    version, message = step
    assert feed.next_message(version, lambda: True, 0.01) == (version, message)  # a resend, unchanged
    assert feed.next_message(version, lambda: False, 0.01) is None  # the client went away
    devices = health_pb.NodeWatchResourcesResponse.FromString(message or b"").devices
    assert [d.last_updated_time for d in devices] == [1000, int(SINCE.timestamp())]
    assert len(devices[1].message) <= MAX_MESSAGE_CHARS and "(5000 characters in all)" in devices[1].message
    now[0] = 2000.0
    feed.update([healthy, DeviceHealthReport("p", "gpu-1", HealthStatus.HEALTHY)])
    step = feed.next_message(version, lambda: True, 0.0)
    assert step is not None and step[0] == version + 1
    devices = health_pb.NodeWatchResourcesResponse.FromString(step[1] or b"").devices
    assert [d.last_updated_time for d in devices] == [1000, 2000]  # gpu-0 healthy since 1000 still
    feed.close()
    assert feed.next_message(step[0], lambda: True, 0.01) is None


@pytest.mark.parametrize("service", SERVICES)
def test_an_oversized_request_is_refused(dra: DraNode, service: str) -> None:
    plugin = dra.plugin()
    with grpc.insecure_channel(f"unix:{plugin.endpoint}") as channel:
        watch = channel.unary_stream(f"/{service}/NodeWatchResources")
        with pytest.raises(grpc.RpcError) as info:
            list(watch(b"\x00" * 2048, timeout=HANG_GUARD_S))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "2048 bytes" in info.value.details()  # type: ignore[attr-defined]
    assert plugin.health_feed.streams == 0


def _without_package(file: FileDescriptor) -> str:
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    package = proto.package
    proto.ClearField("name")
    proto.ClearField("package")
    return text_format.MessageToString(proto).replace(f".{package}.", ".")


def test_every_version_is_the_same_wire_format_so_one_message_serves_them_all() -> None:
    # The feed serializes one response for every version: a version whose fields differ would be misread.
    assert SERVICES == ("v1.DRAResourceHealth", "v1beta1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
    files = [v1_pb.DESCRIPTOR, v1beta1_pb.DESCRIPTOR, health_pb.DESCRIPTOR]
    assert [f.services_by_name["DRAResourceHealth"].full_name for f in files] == list(SERVICES)
    assert _without_package(files[1]) == _without_package(files[0])
    assert _without_package(files[2]) == _without_package(files[0])


def test_the_stand_in_refuses_a_health_service_it_does_not_know(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown DRA health service 'v2\.DRAResourceHealth'"):
        HealthWatch(tmp_path / "dra.sock", "v2.DRAResourceHealth")

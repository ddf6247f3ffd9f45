"""The metrics server over real HTTP, read the way Prometheus reads it, with a real plugin manager
registering against the kubelet stand-in so the hooks fire from the places that call them in production."""

from __future__ import annotations

import platform
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from nvidia_device_plugin import __version__
from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.devices import Gpu, Inventory, MigDevice
from nvidia_device_plugin.errors import AllocationError, ConfigError, DevicePluginError
from nvidia_device_plugin.events import NO_EVENTS, HealthChange
from nvidia_device_plugin.health_state import HealthRegistry
from nvidia_device_plugin.kubelet_standin import KubeletStandIn
from nvidia_device_plugin.metrics import MetricsServer, parse_address, start_metrics
from nvidia_device_plugin.plugin.manager import PluginManager, ResourceSpec
from nvidia_device_plugin.plugin.server import DeviceState
from nvidia_device_plugin.resources import ResourcePlan, mig_device, replica_of, whole_gpu_device

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-1111-1111-1111-111111111111"
GPU2 = "GPU-22222222-2222-2222-2222-222222222222"
MIG2_0 = "MIG-22222222-aaaa-0000-0000-000000000000"
MIG2_1 = "MIG-22222222-bbbb-0000-0000-000000000000"

SHARED = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.10gb"


def _gpu(index: int, uuid: str, name: str, migs: tuple[MigDevice, ...] = ()) -> Gpu:
    return Gpu(
        index=index,
        uuid=uuid,
        name=name,
        memory_bytes=80 << 30,
        pci_bus_id=f"00000000:0{index}:00.0",
        minor=index,
        numa_node=0,
        mig_enabled=bool(migs),
        mig_devices=migs,
    )


def _mig(uuid: str, index: int) -> MigDevice:
    return MigDevice(
        uuid, index, GPU2, 2, "1g.10gb", 10 << 30, gpu_instance_id=index + 1, compute_instance_id=0
    )


MIGS = (_mig(MIG2_0, 0), _mig(MIG2_1, 1))
INVENTORY = Inventory(
    gpus=(
        _gpu(0, GPU0, "NVIDIA A100-SXM4-80GB"),
        _gpu(1, GPU1, "NVIDIA A100-SXM4-80GB"),
        _gpu(2, GPU2, "NVIDIA H100 80GB HBM3", MIGS),
    ),
    driver_version="550.54.15",
    cuda_driver_version=12040,
)
# Two whole GPUs time-sliced four ways, and GPU 2 carved into two MIG devices.
PLANS = (
    ResourcePlan(
        SHARED,
        tuple(replica_of(whole_gpu_device(gpu), r) for gpu in INVENTORY.gpus[:2] for r in range(4)),
        sharing="time-slicing",
        replicas=4,
    ),
    ResourcePlan(MIG, tuple(mig_device(INVENTORY.gpus[2], m) for m in MIGS)),
)


@dataclass(frozen=True)
class FakeSnapshot:
    config: Config
    inventory: Inventory
    plans: tuple[ResourcePlan, ...]


@dataclass
class FakeDaemon:
    """The daemon attributes metrics read, from real parts; the test plays NVML and the config watcher."""

    manager: PluginManager
    registry: HealthRegistry = field(default_factory=HealthRegistry)
    snapshot: FakeSnapshot | None = None
    reload_listeners: list[Callable[[bool, str], None]] = field(default_factory=list)
    xid_listeners: list[Callable[[str, int, bool], None]] = field(default_factory=list)


class PlanBackend:
    """Serves one plan's devices, with health from the registry; refuses IDs it does not advertise."""

    def __init__(self, plan: ResourcePlan, registry: HealthRegistry) -> None:
        self.plan = plan
        self.registry = registry
        self.fail_preferred = False

    def devices(self) -> Sequence[DeviceState]:
        return [DeviceState(d.id, self.registry.is_healthy(d), d.numa_node) for d in self.plan.devices]

    def allocate(self, requests: Sequence[Sequence[str]]) -> pb.AllocateResponse:
        response = pb.AllocateResponse()
        for ids in requests:
            unknown = [i for i in ids if self.plan.device(i) is None]
            if unknown:
                raise AllocationError(f"{self.plan.name} has no device {unknown[0]!r}")
            response.container_responses.add(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(ids)})
        return response

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        if self.fail_preferred:
            raise RuntimeError("topology lookup failed")
        return sorted(available)[:size]


@pytest.fixture
def daemon(plugin_dir: Path) -> Iterator[FakeDaemon]:
    manager = PluginManager(plugin_dir)
    manager.start()
    yield FakeDaemon(manager)
    manager.stop()


@pytest.fixture
def metrics(daemon: FakeDaemon) -> Iterator[MetricsServer]:
    server = start_metrics("127.0.0.1:0", daemon)
    yield server
    server.stop()


def serve(daemon: FakeDaemon) -> dict[str, PlanBackend]:
    """What the daemon does after discovery: set the snapshot and serve one backend per plan."""
    daemon.snapshot = FakeSnapshot(Config(), INVENTORY, PLANS)
    backends = {plan.name: PlanBackend(plan, daemon.registry) for plan in PLANS}
    daemon.manager.apply(
        {
            name: ResourceSpec(name, f"nvidia-{i}.sock", b)
            for i, (name, b) in enumerate(sorted(backends.items()))
        }
    )
    return backends


def get(server: MetricsServer, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


Families = dict[str, list[Sample]]


def scrape(server: MetricsServer) -> Families:
    """Family name -> samples, parsed by prometheus_client's own text-format parser, as a scraper would."""
    status, text = get(server, "/metrics")
    assert status == 200
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def samples(families: Families, sample_name: str) -> list[Sample]:
    return [s for family in families.values() for s in family if s.name == sample_name]


def value(families: Families, sample_name: str, **labels: str) -> float:
    matches = [
        s.value
        for s in samples(families, sample_name)
        if all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(matches) == 1, (
        f"{sample_name}{labels}: {len(matches)} samples in {samples(families, sample_name)}"
    )
    return matches[0]


def label_sets(families: Families, sample_name: str) -> list[dict[str, str]]:
    return sorted((dict(s.labels) for s in samples(families, sample_name)), key=lambda d: sorted(d.items()))


# ---- address parsing -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        (":9402", ("", 9402)),
        ("0.0.0.0:9402", ("0.0.0.0", 9402)),
        ("[::1]:0", ("::1", 0)),
        ("localhost:80", ("localhost", 80)),
    ],
)
def test_parse_address_accepts_host_port_forms(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["9402", ":", ":http", ":70000", "::1:9402", "host:-1"])
def test_parse_address_rejects_malformed_values_naming_the_flag(address: str) -> None:
    with pytest.raises(ConfigError, match="--metrics-address"):
        parse_address(address)


def test_port_in_use_is_a_clear_error(daemon: FakeDaemon, metrics: MetricsServer) -> None:
    with pytest.raises(
        DevicePluginError, match=r"cannot serve metrics on --metrics-address '127\.0\.0\.1:\d+'"
    ):
        start_metrics(f"127.0.0.1:{metrics.port}", daemon)


# ---- HTTP endpoints --------------------------------------------------------------------------------


def test_healthz_is_ok_and_unknown_paths_are_404(metrics: MetricsServer) -> None:
    assert metrics.port > 0
    assert get(metrics, "/healthz") == (200, "ok\n")
    status, body = get(metrics, "/nope")
    assert status == 404
    assert "/metrics" in body


def test_readyz_turns_ready_when_every_served_resource_is_registered(
    plugin_dir: Path, daemon: FakeDaemon, metrics: MetricsServer
) -> None:
    status, body = get(metrics, "/readyz")
    assert status == 503
    assert "no resources served" in body

    serve(daemon)  # kubelet is not up yet: served, not registered
    status, body = get(metrics, "/readyz")
    assert status == 503
    assert f"waiting for kubelet to register {SHARED}, {MIG}" in body
    families = scrape(metrics)
    assert value(families, "nvidia_device_plugin_resource_registered", resource=SHARED) == 0

    with KubeletStandIn(plugin_dir) as kubelet:
        assert kubelet.wait_for_resources([SHARED, MIG])
        assert kubelet.wait_for(daemon.manager.all_registered)
        assert get(metrics, "/readyz") == (200, "ok\n")
        families = scrape(metrics)
        assert value(families, "nvidia_device_plugin_resource_registered", resource=SHARED) == 1
        assert value(families, "nvidia_device_plugin_resource_registered", resource=MIG) == 1


# ---- state computed at scrape time ---------------------------------------------------------------


def test_before_discovery_state_metrics_are_empty_and_build_info_is_there(metrics: MetricsServer) -> None:
    families = scrape(metrics)
    for name in (
        "nvidia_device_plugin_devices",
        "nvidia_device_plugin_gpus",
        "nvidia_device_plugin_driver_info",
    ):
        assert name in families  # described, so dashboards see the metric exists
        assert samples(families, name) == []
    build = label_sets(families, "nvidia_device_plugin_build_info")
    assert build == [{"version": __version__, "python_version": platform.python_version()}]
    assert value(families, "nvidia_device_plugin_build_info") == 1


def test_advertised_devices_gpus_and_replicas_follow_the_snapshot(
    daemon: FakeDaemon, metrics: MetricsServer
) -> None:
    serve(daemon)
    families = scrape(metrics)
    assert value(families, "nvidia_device_plugin_devices", resource=SHARED, health="healthy") == 8
    assert value(families, "nvidia_device_plugin_devices", resource=SHARED, health="unhealthy") == 0
    assert value(families, "nvidia_device_plugin_devices", resource=MIG, health="healthy") == 2
    assert value(families, "nvidia_device_plugin_gpus", model="NVIDIA A100-SXM4-80GB") == 2
    assert value(families, "nvidia_device_plugin_gpus", model="NVIDIA H100 80GB HBM3") == 1
    assert value(families, "nvidia_device_plugin_mig_devices", profile="1g.10gb") == 2
    # Replicas are reported for shared resources only, one series per physical GPU.
    assert label_sets(families, "nvidia_device_plugin_replicas") == [
        {"resource": SHARED, "gpu_uuid": GPU0},
        {"resource": SHARED, "gpu_uuid": GPU1},
    ]
    assert value(families, "nvidia_device_plugin_replicas", resource=SHARED, gpu_uuid=GPU1) == 4
    assert label_sets(families, "nvidia_device_plugin_driver_info") == [
        {"driver_version": "550.54.15", "cuda_driver_version": "12.4"}
    ]


def test_unhealthy_devices_show_with_reason_and_move_between_health_series(
    daemon: FakeDaemon, metrics: MetricsServer
) -> None:
    serve(daemon)
    daemon.registry.mark(
        HealthChange(GPU1, healthy=False, reason="XID 79 (GPU has fallen off the bus)", xid=79)
    )
    # A whole GPU takes its MIG devices down with it.
    daemon.registry.mark(HealthChange(GPU2, healthy=False, reason="GPU lost"))
    families = scrape(metrics)
    assert value(families, "nvidia_device_plugin_devices", resource=SHARED, health="healthy") == 4
    assert value(families, "nvidia_device_plugin_devices", resource=SHARED, health="unhealthy") == 4
    assert value(families, "nvidia_device_plugin_devices", resource=MIG, health="unhealthy") == 2
    assert label_sets(families, "nvidia_device_plugin_unhealthy_device") == [
        {"uuid": GPU1, "gpu_uuid": GPU1, "reason": "XID 79 (GPU has fallen off the bus)"},
        {"uuid": GPU2, "gpu_uuid": GPU2, "reason": "GPU lost"},
    ]
    assert value(families, "nvidia_device_plugin_device_health_changes_total", health="unhealthy") == 2

    daemon.registry.mark(HealthChange(GPU2, healthy=True, reason="recovered"))
    daemon.registry.mark(HealthChange(MIG2_1, healthy=False, reason="XID 94 (contained ECC error)", xid=94))
    families = scrape(metrics)
    assert value(families, "nvidia_device_plugin_devices", resource=MIG, health="healthy") == 1
    assert label_sets(families, "nvidia_device_plugin_unhealthy_device") == [
        {"uuid": GPU1, "gpu_uuid": GPU1, "reason": "XID 79 (GPU has fallen off the bus)"},
        {"uuid": MIG2_1, "gpu_uuid": GPU2, "reason": "XID 94 (contained ECC error)"},
    ]
    assert value(families, "nvidia_device_plugin_device_health_changes_total", health="healthy") == 1
    assert value(families, "nvidia_device_plugin_device_health_changes_total", health="unhealthy") == 3


# ---- events counted by hooks -----------------------------------------------------------------------


def test_allocate_and_preferred_calls_are_counted_and_timed(
    kubelet: KubeletStandIn, daemon: FakeDaemon, metrics: MetricsServer
) -> None:
    backends = serve(daemon)
    assert kubelet.wait_for_resources([SHARED, MIG])
    families = scrape(metrics)
    # Registered resources show their counters at 0 before the first call.
    assert value(families, "nvidia_device_plugin_allocations_total", resource=SHARED) == 0
    assert (
        value(families, "nvidia_device_plugin_allocate_errors_total", resource=SHARED, code="internal") == 0
    )

    kubelet.admit(SHARED, 2)
    kubelet.admit(SHARED, 1)
    with pytest.raises(grpc.RpcError):
        kubelet.allocate(SHARED, [["GPU-not-here::0"]])
    backends[MIG].fail_preferred = True
    with pytest.raises(grpc.RpcError):
        kubelet.preferred(MIG, [MIG2_0, MIG2_1], [], 1)

    families = scrape(metrics)
    assert value(families, "nvidia_device_plugin_allocations_total", resource=SHARED) == 2
    assert (
        value(
            families, "nvidia_device_plugin_allocate_errors_total", resource=SHARED, code="invalid_argument"
        )
        == 1
    )
    assert (
        value(families, "nvidia_device_plugin_allocate_errors_total", resource=SHARED, code="internal") == 0
    )
    assert value(families, "nvidia_device_plugin_allocate_duration_seconds_count", resource=SHARED) == 3
    assert (
        value(families, "nvidia_device_plugin_allocate_duration_seconds_bucket", resource=SHARED, le="+Inf")
        == 3
    )
    assert value(families, "nvidia_device_plugin_allocate_duration_seconds_sum", resource=SHARED) > 0
    assert (
        value(families, "nvidia_device_plugin_preferred_allocation_duration_seconds_count", resource=SHARED)
        == 2
    )
    assert (
        value(
            families, "nvidia_device_plugin_preferred_allocation_errors_total", resource=MIG, code="internal"
        )
        == 1
    )
    buckets = [
        float(s.labels["le"])
        for s in samples(families, "nvidia_device_plugin_allocate_duration_seconds_bucket")
        if s.labels["resource"] == SHARED
    ]
    assert buckets[0] == 0.0001
    assert buckets[-2:] == [1.0, float("inf")]


def test_registrations_and_kubelet_restarts_are_counted(
    kubelet: KubeletStandIn, daemon: FakeDaemon, metrics: MetricsServer
) -> None:
    serve(daemon)
    assert kubelet.wait_for(daemon.manager.all_registered)
    families = scrape(metrics)
    assert value(families, "nvidia_device_plugin_registrations_total", resource=SHARED) == 1
    assert value(families, "nvidia_device_plugin_kubelet_restarts_total") == 0

    kubelet.restart()
    # A restart can take more than one Register call: kubelet wipes the directory while the plugin is
    # already re-serving, and a dial-back that hits a wiped socket is retried.
    assert kubelet.wait_for(
        lambda: (
            len([r for r in kubelet.registrations if r.resource_name == SHARED]) >= 2
            and daemon.manager.all_registered()
        )
    )
    families = scrape(metrics)
    assert value(families, "nvidia_device_plugin_kubelet_restarts_total") >= 1
    assert value(families, "nvidia_device_plugin_registrations_total", resource=SHARED) >= 2
    assert value(families, "nvidia_device_plugin_registrations_total", resource=MIG) >= 2


def test_xids_and_config_reloads_are_counted(daemon: FakeDaemon, metrics: MetricsServer) -> None:
    families = scrape(metrics)
    assert value(families, "nvidia_device_plugin_config_reloads_total", result="applied") == 0
    assert value(families, "nvidia_device_plugin_config_reloads_total", result="rejected") == 0
    assert samples(families, "nvidia_device_plugin_xid_events_total") == []

    for listener in daemon.xid_listeners:  # as the health monitor reports each XID
        listener(GPU0, 13, False)
        listener(GPU0, 13, False)
        listener(GPU1, 79, True)
    for reload_listener in daemon.reload_listeners:  # as Daemon.reload reports each outcome
        reload_listener(True, "")
        reload_listener(False, "sharing.timeSlicing.resources[0].replicas must be >= 1, got 0")
        reload_listener(False, "flags.migStrategy must be one of none, single, mixed")

    families = scrape(metrics)
    assert label_sets(families, "nvidia_device_plugin_xid_events_total") == [
        {"gpu_uuid": GPU0, "xid": "13", "critical": "false"},
        {"gpu_uuid": GPU1, "xid": "79", "critical": "true"},
    ]
    assert value(families, "nvidia_device_plugin_xid_events_total", gpu_uuid=GPU0, xid="13") == 2
    assert value(families, "nvidia_device_plugin_config_reloads_total", result="applied") == 1
    assert value(families, "nvidia_device_plugin_config_reloads_total", result="rejected") == 2


def test_two_servers_keep_separate_counters_and_stop_unhooks(plugin_dir: Path) -> None:
    first = FakeDaemon(PluginManager(plugin_dir / "a"))
    second = FakeDaemon(PluginManager(plugin_dir / "b"))
    one, two = start_metrics("127.0.0.1:0", first), start_metrics("127.0.0.1:0", second)
    try:
        for listener in first.reload_listeners:
            listener(True, "")
        assert value(scrape(one), "nvidia_device_plugin_config_reloads_total", result="applied") == 1
        assert value(scrape(two), "nvidia_device_plugin_config_reloads_total", result="applied") == 0
    finally:
        one.stop()
        two.stop()
    assert first.reload_listeners == []
    assert first.xid_listeners == []
    assert first.manager.events is NO_EVENTS
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{one.port}/healthz", timeout=2)


def test_stop_joins_the_named_thread(daemon: FakeDaemon) -> None:
    server = start_metrics("127.0.0.1:0", daemon)
    assert "metrics-http" in {t.name for t in threading.enumerate()}
    server.stop()
    assert "metrics-http" not in {t.name for t in threading.enumerate()}


class BrokenSnapshotDaemon(FakeDaemon):
    """A daemon whose snapshot cannot be read, to see a scrape fail without taking the server down."""

    @property  # type: ignore[override]
    def snapshot(self) -> FakeSnapshot | None:
        raise RuntimeError("snapshot unavailable")

    @snapshot.setter
    def snapshot(self, value: FakeSnapshot | None) -> None:
        pass


def test_a_failing_collection_answers_500_and_the_server_keeps_serving(plugin_dir: Path) -> None:
    daemon = BrokenSnapshotDaemon(PluginManager(plugin_dir))
    try:
        server = start_metrics("127.0.0.1:0", daemon)
    except RuntimeError:
        pytest.fail("start_metrics must not scrape the snapshot before it is asked to")
    try:
        status, body = get(server, "/metrics")
        assert status == 500
        assert "see the plugin log" in body
        assert get(server, "/healthz") == (200, "ok\n")
    finally:
        server.stop()

"""The daemon's /metrics, /healthz and /readyz over real HTTP, read the way Prometheus reads them.

Every test but the last runs the real Daemon on a simulated node, registered (or not yet) with the
kubelet stand-in over real unix sockets; health events come from the pynvml simulator, Allocate and
GetPreferredAllocation from the stand-in, reloads from Daemon.reload with a config that loads or fails.
The exposition is parsed by prometheus_client's own text parser, as a scraper would.
"""

from __future__ import annotations

import platform
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from nvidia_device_plugin import __version__
from nvidia_device_plugin.base.errors import ConfigError, DevicePluginError, NvmlError
from nvidia_device_plugin.config.v1 import Config, Flags, ReplicatedResource, ReplicatedResources, Sharing
from nvidia_device_plugin.daemons.run import Daemon
from nvidia_device_plugin.events import HealthChange
from nvidia_device_plugin.health.policy import RECOVERED
from nvidia_device_plugin.health.registry import HealthRegistry
from nvidia_device_plugin.nvml.session import NvmlSession
from nvidia_device_plugin.plugin.manager import PluginManager
from nvidia_device_plugin.standins.kubelet import KubeletStandIn
from nvidia_device_plugin.telemetry.metrics import DaemonMetrics, SnapshotView
from nvidia_device_plugin.telemetry.probes import ProbeServer

from support.checks import assert_all
from support.daemon_support import GPU, gpu_uuids, simulated_options, simulator
from support.kubelet_standin import kubelet_standin
from support.threads import threads_named
from support.waiting import scaled

MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_2G = "nvidia.com/mig-2g.20gb"
MIG_3G = "nvidia.com/mig-3g.40gb"
MIXED_RESOURCES = [GPU, MIG_1G, MIG_2G, MIG_3G]
A100 = "NVIDIA A100-SXM4-80GB"
XID_79 = "XID 79 (GPU has fallen off the bus)"


def mixed_config(gpu_replicas: int = 4, mig_replicas: int | None = 2) -> Config:
    """a100-mig-mixed served with the mixed strategy: the whole GPU 3 time-sliced, 1g.10gb slices too."""
    shared = [ReplicatedResource(name=GPU, replicas=gpu_replicas)]
    if mig_replicas is not None:
        shared.append(ReplicatedResource(name=MIG_1G, replicas=mig_replicas))
    return Config(
        flags=Flags(mig_strategy="mixed"),
        sharing=Sharing(time_slicing=ReplicatedResources(resources=tuple(shared))),
    )


# Every scrape renders anew: each daemon and server here is built with no render cache window.
FRESH_SCRAPES = {"metrics_render_cache_s": 0.0}


@contextmanager
def running(plugin_dir: Path, node: str, load_config: Callable[[], Config]) -> Iterator[Daemon]:
    """A started daemon on a simulated node serving HTTP on a free port; stopped on the way out."""
    daemon = Daemon(
        simulated_options(plugin_dir, node, load_config, metrics_address="127.0.0.1:0", **FRESH_SCRAPES)
    )
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture
def configs() -> list[Config | Exception]:
    """What the mixed daemon's load_config answers: the last entry, raised when it is an exception."""
    return [mixed_config()]


@pytest.fixture
def mixed(plugin_dir: Path, kubelet: KubeletStandIn, configs: list[Config | Exception]) -> Iterator[Daemon]:
    """The daemon on a simulated a100-mig-mixed with mixed MIG + time-slicing, registered with kubelet."""

    def load() -> Config:
        current = configs[-1]
        if isinstance(current, Exception):
            raise current
        return current

    with running(plugin_dir, "a100-mig-mixed", load) as daemon:
        assert kubelet.wait_for_resources(MIXED_RESOURCES)
        yield daemon


def no_driver() -> NvmlSession:
    raise NvmlError("NVIDIA driver library not found: is this a GPU node?")


@pytest.fixture
def idle(plugin_dir: Path) -> Iterator[Daemon]:
    """A daemon on a node where NVML cannot load and failOnInitError is false: it serves nothing."""
    options = simulated_options(
        plugin_dir, load_config=lambda: Config(flags=Flags(fail_on_init_error=False)), **FRESH_SCRAPES
    )
    options.open_nvml, options.metrics_address = no_driver, "127.0.0.1:0"
    daemon = Daemon(options)
    daemon.start()
    yield daemon
    daemon.stop()


# ---- talking HTTP like a scraper --------------------------------------------------------------------


def port_of(daemon: Daemon) -> int:
    assert daemon.probes is not None
    return daemon.probes.port


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=scaled(5)) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


Families = dict[str, list[Sample]]


def scrape(daemon: Daemon) -> Families:
    """Family name -> samples, parsed by prometheus_client's own text-format parser."""
    status, text = get(port_of(daemon), "/metrics")
    assert status == 200, text
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def scrape_until(
    daemon: Daemon, predicate: Callable[[Families], bool], timeout: float = scaled(10.0)
) -> Families:
    """Scrape until predicate holds: registrar threads count a moment after kubelet has seen the call."""
    deadline = time.monotonic() + timeout
    while True:
        families = scrape(daemon)
        if predicate(families) or time.monotonic() > deadline:
            return families
        time.sleep(0.02)


def samples(families: Families, sample_name: str) -> list[Sample]:
    return [s for family in families.values() for s in family if s.name == sample_name]


def matching(families: Families, sample_name: str, **labels: str) -> list[float]:
    return [
        s.value
        for s in samples(families, sample_name)
        if all(s.labels.get(k) == v for k, v in labels.items())
    ]


def value(families: Families, sample_name: str, **labels: str) -> float:
    found = matching(families, sample_name, **labels)
    assert len(found) == 1, f"{sample_name}{labels}: {len(found)} samples in {samples(families, sample_name)}"
    return found[0]


def series(families: Families, sample_name: str, *label_names: str) -> dict[tuple[str, ...], float]:
    """Every sample of one name, keyed by the values of `label_names` (which must name all its labels)."""
    found = samples(families, sample_name)
    assert_all(found, lambda s: len(s.labels) == len(label_names), found)
    return {tuple(s.labels[name] for name in label_names): s.value for s in found}


def in_order(*label_sets: dict[str, str]) -> list[dict[str, str]]:
    """Label sets in one fixed order, so series can be compared whatever order they are exposed in."""
    return sorted(label_sets, key=lambda labels: sorted(labels.items()))


def label_sets(families: Families, sample_name: str) -> list[dict[str, str]]:
    return in_order(*(dict(s.labels) for s in samples(families, sample_name)))


def mig_uuids(daemon: Daemon, gpu_index: int) -> list[str]:
    assert daemon.snapshot is not None
    gpu = next(g for g in daemon.snapshot.inventory.gpus if g.index == gpu_index)
    return [m.uuid for m in sorted(gpu.mig_devices, key=lambda m: m.index)]


# ---- binding the address ----------------------------------------------------------------------------


def test_a_malformed_address_fails_the_daemon_start_naming_the_flag(plugin_dir: Path) -> None:
    daemon = Daemon(simulated_options(plugin_dir, metrics_address="localhost", **FRESH_SCRAPES))
    try:
        with pytest.raises(ConfigError, match="--metrics-address"):
            daemon.start()
    finally:
        daemon.stop()


def test_port_in_use_is_a_clear_error(plugin_dir: Path, idle: Daemon) -> None:
    address = f"127.0.0.1:{port_of(idle)}"
    second = Daemon(simulated_options(plugin_dir / "second", metrics_address=address, **FRESH_SCRAPES))
    try:
        with pytest.raises(
            DevicePluginError, match=r"cannot serve metrics on --metrics-address '127\.0\.0\.1:\d+'"
        ):
            second.start()
    finally:
        second.stop()
    assert get(port_of(idle), "/healthz") == (200, "ok\n")  # the first daemon's server is untouched


# ---- probes -----------------------------------------------------------------------------------------


def test_an_idle_daemon_is_alive_not_ready_and_describes_empty_state(idle: Daemon) -> None:
    port = port_of(idle)
    assert port > 0
    assert get(port, "/healthz") == (200, "ok\n")
    status, body = get(port, "/readyz")
    assert status == 503
    assert "no resources served" in body
    status, body = get(port, "/nope")
    assert status == 404
    assert "/metrics" in body

    families = scrape(idle)
    for name in (
        "nvidia_device_plugin_devices",
        "nvidia_device_plugin_gpus",
        "nvidia_device_plugin_driver_info",
        "nvidia_device_plugin_resource_registered",
    ):
        assert name in families  # described, so dashboards see the metric exists
        assert samples(families, name) == []
    build_info = label_sets(families, "nvidia_device_plugin_build_info")
    assert build_info == [{"version": __version__, "python_version": platform.python_version()}]
    assert value(families, "nvidia_device_plugin_build_info") == 1


def test_readyz_turns_ready_when_every_served_resource_is_registered(plugin_dir: Path) -> None:
    with running(plugin_dir, "a100-mig-mixed", mixed_config) as daemon:  # no kubelet yet: none registered
        port = port_of(daemon)
        status, body = get(port, "/readyz")
        assert status == 503
        assert f"waiting for kubelet to register {', '.join(MIXED_RESOURCES)}" in body
        families = scrape(daemon)
        for name in MIXED_RESOURCES:
            assert value(families, "nvidia_device_plugin_resource_registered", resource=name) == 0

        with kubelet_standin(plugin_dir) as kubelet:
            assert kubelet.wait_for_resources(MIXED_RESOURCES)
            assert kubelet.wait_for(daemon.manager.all_registered)
            assert get(port, "/readyz") == (200, "ok\n")
            families = scrape(daemon)
            for name in MIXED_RESOURCES:
                assert value(families, "nvidia_device_plugin_resource_registered", resource=name) == 1


# ---- state computed at scrape time ------------------------------------------------------------------


def test_advertised_devices_gpus_and_replicas_follow_the_snapshot(
    mixed: Daemon, configs: list[Config | Exception]
) -> None:
    uuids = gpu_uuids(mixed)
    families = scrape(mixed)
    devices = "nvidia_device_plugin_devices"
    assert series(families, devices, "resource", "health") == {
        (GPU, "healthy"): 4,  # GPU 3, four ways
        (GPU, "unhealthy"): 0,
        (MIG_1G, "healthy"): 18,  # nine slices, two ways
        (MIG_1G, "unhealthy"): 0,
        (MIG_2G, "healthy"): 1,
        (MIG_2G, "unhealthy"): 0,
        (MIG_3G, "healthy"): 3,
        (MIG_3G, "unhealthy"): 0,
    }
    assert series(families, "nvidia_device_plugin_gpus", "model") == {(A100,): 4}
    mig = series(families, "nvidia_device_plugin_mig_devices", "profile")
    assert mig == {("1g.10gb",): 9, ("2g.20gb",): 1, ("3g.40gb",): 3}
    # Replicas are reported for shared resources only, one series per physical GPU.
    assert series(families, "nvidia_device_plugin_replicas", "resource", "gpu_uuid") == {
        (GPU, uuids[3]): 4,
        (MIG_1G, uuids[0]): 14,
        (MIG_1G, uuids[1]): 4,
    }
    assert label_sets(families, "nvidia_device_plugin_driver_info") == [
        {"driver_version": "550.54.15", "cuda_driver_version": "12.4"}
    ]

    # A reload changes what is advertised; the next scrape says so.
    configs.append(mixed_config(gpu_replicas=2, mig_replicas=None))
    assert mixed.reload("test")
    families = scrape(mixed)
    assert value(families, devices, resource=GPU, health="healthy") == 2
    assert value(families, devices, resource=MIG_1G, health="healthy") == 9
    assert series(families, "nvidia_device_plugin_replicas", "resource", "gpu_uuid") == {(GPU, uuids[3]): 2}


def test_unhealthy_devices_show_with_reason_and_move_between_health_series(mixed: Daemon) -> None:
    uuids = gpu_uuids(mixed)
    slice_on_gpu1 = mig_uuids(mixed, 1)[2]  # a 1g.10gb slice
    sim = simulator(mixed)
    sim.inject_xid(3, 79)  # the whole, time-sliced GPU
    sim.inject_xid(2, 79)  # a MIG-mode GPU, not attributed to one instance: both 3g.40gb slices go
    changes = "nvidia_device_plugin_device_health_changes_total"
    families = scrape_until(mixed, lambda f: value(f, changes, health="unhealthy") == 2)
    devices = "nvidia_device_plugin_devices"
    assert series(families, devices, "resource", "health") == {
        (GPU, "healthy"): 0,
        (GPU, "unhealthy"): 4,
        (MIG_1G, "healthy"): 18,
        (MIG_1G, "unhealthy"): 0,
        (MIG_2G, "healthy"): 1,
        (MIG_2G, "unhealthy"): 0,
        (MIG_3G, "healthy"): 1,
        (MIG_3G, "unhealthy"): 2,
    }
    assert label_sets(families, "nvidia_device_plugin_unhealthy_device") == in_order(
        {"uuid": uuids[2], "gpu_uuid": uuids[2], "reason": XID_79},
        {"uuid": uuids[3], "gpu_uuid": uuids[3], "reason": XID_79},
    )
    assert value(families, changes, health="unhealthy") == 2

    # GPU 2 is declared healthy again (what recovery does), and one MIG slice on GPU 1 faults.
    assert mixed.registry.mark(HealthChange(uuids[2], healthy=True, cause=RECOVERED))
    sim.inject_xid(slice_on_gpu1, 94)
    families = scrape_until(mixed, lambda f: value(f, changes, health="unhealthy") == 3)
    assert value(families, devices, resource=MIG_3G, health="healthy") == 3
    assert value(families, devices, resource=MIG_1G, health="unhealthy") == 2  # its two replicas
    assert label_sets(families, "nvidia_device_plugin_unhealthy_device") == in_order(
        {"uuid": uuids[3], "gpu_uuid": uuids[3], "reason": XID_79},
        {"uuid": slice_on_gpu1, "gpu_uuid": uuids[1], "reason": "XID 94 (contained ECC error)"},
    )
    assert value(families, changes, health="healthy") == 1
    assert value(families, changes, health="unhealthy") == 3


# ---- events counted ---------------------------------------------------------------------------------


def test_allocate_and_preferred_calls_are_counted_and_timed(mixed: Daemon, kubelet: KubeletStandIn) -> None:
    allocations = "nvidia_device_plugin_allocations_total"
    allocate_errors = "nvidia_device_plugin_allocate_errors_total"
    preferred_errors = "nvidia_device_plugin_preferred_allocation_errors_total"
    # Registered resources show their counters at 0 before the first call.
    families = scrape_until(
        mixed, lambda f: all(matching(f, allocations, resource=r) for r in MIXED_RESOURCES)
    )
    for name in MIXED_RESOURCES:
        assert value(families, allocations, resource=name) == 0
        assert value(families, allocate_errors, resource=name, code="internal") == 0
        assert value(families, preferred_errors, resource=name, code="invalid_argument") == 0

    kubelet.admit(GPU, 2)  # each admit asks GetPreferredAllocation, then Allocate
    kubelet.admit(GPU, 1)
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.allocate(GPU, [["GPU-not-here::0"]])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    one_slice = sorted(kubelet.devices(MIG_3G))[:1]
    with pytest.raises(grpc.RpcError) as too_many:
        kubelet.preferred(MIG_3G, one_slice, [], 2)
    assert too_many.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    families = scrape(mixed)
    assert value(families, allocations, resource=GPU) == 2
    assert value(families, allocate_errors, resource=GPU, code="invalid_argument") == 1
    assert value(families, allocate_errors, resource=GPU, code="internal") == 0
    assert value(families, allocations, resource=MIG_3G) == 0
    duration = "nvidia_device_plugin_allocate_duration_seconds"
    assert value(families, duration + "_count", resource=GPU) == 3
    assert value(families, duration + "_bucket", resource=GPU, le="+Inf") == 3
    assert value(families, duration + "_sum", resource=GPU) > 0
    preferred = "nvidia_device_plugin_preferred_allocation_duration_seconds"
    assert value(families, preferred + "_count", resource=GPU) == 2
    assert value(families, preferred + "_count", resource=MIG_3G) == 1
    assert value(families, preferred_errors, resource=MIG_3G, code="invalid_argument") == 1
    assert value(families, preferred_errors, resource=GPU, code="invalid_argument") == 0
    buckets = [
        float(s.labels["le"]) for s in samples(families, duration + "_bucket") if s.labels["resource"] == GPU
    ]
    assert buckets[0] == 0.0001
    assert buckets[-2:] == [1.0, float("inf")]


def test_registrations_and_kubelet_restarts_are_counted(mixed: Daemon, kubelet: KubeletStandIn) -> None:
    registrations = "nvidia_device_plugin_registrations_total"
    families = scrape_until(
        mixed, lambda f: all(matching(f, registrations, resource=r) == [1] for r in MIXED_RESOURCES)
    )
    for name in MIXED_RESOURCES:
        assert value(families, registrations, resource=name) == 1
    assert value(families, "nvidia_device_plugin_kubelet_restarts_total") == 0

    kubelet.restart()
    # A restart can take more than one Register call: kubelet wipes the directory while the plugin is
    # already re-serving, and a dial-back that hits a wiped socket is retried.
    families = scrape_until(
        mixed,
        lambda f: (
            all(sum(matching(f, registrations, resource=r)) >= 2 for r in MIXED_RESOURCES)
            and value(f, "nvidia_device_plugin_kubelet_restarts_total") >= 1
        ),
    )
    assert value(families, "nvidia_device_plugin_kubelet_restarts_total") >= 1
    for name in MIXED_RESOURCES:
        assert value(families, registrations, resource=name) >= 2
    assert kubelet.wait_for_resources(MIXED_RESOURCES)


def test_xids_and_config_reloads_are_counted(mixed: Daemon, configs: list[Config | Exception]) -> None:
    reloads = "nvidia_device_plugin_config_reloads_total"
    xids = "nvidia_device_plugin_xid_events_total"
    families = scrape(mixed)
    assert value(families, reloads, result="applied") == 0
    assert value(families, reloads, result="rejected") == 0
    assert samples(families, xids) == []

    uuids = gpu_uuids(mixed)
    sim = simulator(mixed)
    sim.inject_xid(3, 13)  # an application fault: counted, ignored
    sim.inject_xid(3, 13)
    sim.inject_xid(0, 79)  # one event set, read in order: once GPU 0 is down, the 13s were seen too
    changes = "nvidia_device_plugin_device_health_changes_total"
    scrape_until(mixed, lambda f: value(f, changes, health="unhealthy") == 1)  # counted after the XID
    assert set(mixed.registry.unhealthy()) == {uuids[0]}

    configs.append(ConfigError("sharing.timeSlicing.resources[0].replicas must be >= 1, got 0"))
    assert not mixed.reload("test")
    configs.append(RuntimeError("config directory vanished"))
    assert not mixed.reload("test")
    configs.append(mixed_config(gpu_replicas=2))
    assert mixed.reload("test")

    families = scrape(mixed)
    assert label_sets(families, xids) == in_order(
        {"gpu_uuid": uuids[3], "xid": "13", "critical": "false"},
        {"gpu_uuid": uuids[0], "xid": "79", "critical": "true"},
    )
    assert value(families, xids, gpu_uuid=uuids[3], xid="13") == 2
    assert value(families, xids, gpu_uuid=uuids[0], xid="79") == 1
    assert value(families, reloads, result="applied") == 1
    assert value(families, reloads, result="rejected") == 2


def test_two_daemons_keep_separate_counters_and_stop_closes_the_port(plugin_dir: Path) -> None:
    reloads = "nvidia_device_plugin_config_reloads_total"
    xids = "nvidia_device_plugin_xid_events_total"
    with (
        running(plugin_dir / "a", "dgx-a100", Config) as first,
        running(plugin_dir / "b", "dgx-a100", Config) as second,
    ):
        assert first.reload("test")
        simulator(second).inject_xid(5, 13)
        families = scrape_until(second, lambda f: bool(samples(f, xids)))
        assert label_sets(families, xids) == [
            {"gpu_uuid": gpu_uuids(second)[5], "xid": "13", "critical": "false"}
        ]
        assert value(families, reloads, result="applied") == 0
        families = scrape(first)
        assert value(families, reloads, result="applied") == 1
        assert samples(families, xids) == []
    for daemon in (first, second):
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port_of(daemon)}/healthz", timeout=scaled(2))


def test_stop_joins_the_named_thread(plugin_dir: Path) -> None:
    with running(plugin_dir, "t4-single", Config):
        assert threads_named("probes-http")
    assert not threads_named("probes-http")


# ---- a collection that fails ------------------------------------------------------------------------


class UnreadableSnapshot:
    """What DaemonMetrics reads of a daemon, with a snapshot that cannot be read."""

    def __init__(self, plugin_dir: Path) -> None:
        self.registry = HealthRegistry()
        self.manager = PluginManager(plugin_dir)

    @property
    def snapshot(self) -> SnapshotView | None:
        raise RuntimeError("snapshot unavailable")


def test_a_failing_collection_answers_500_and_the_server_keeps_serving(plugin_dir: Path) -> None:
    metrics = DaemonMetrics(UnreadableSnapshot(plugin_dir))  # building must not read the snapshot
    server = ProbeServer("127.0.0.1:0", metrics.render, lambda: None, lambda: None, render_cache_s=0.0)
    server.start()
    try:
        status, body = get(server.port, "/metrics")
        assert status == 500
        assert "see the plugin log" in body
        assert get(server.port, "/healthz") == (200, "ok\n")
        assert get(server.port, "/metrics")[0] == 500  # every scrape tries anew; none took the server down
    finally:
        server.stop()

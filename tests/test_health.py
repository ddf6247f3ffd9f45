from __future__ import annotations

import logging
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

from nvidia_device_plugin.config.v1 import DEFAULT_IGNORED_XIDS, Health, Recovery
from nvidia_device_plugin.devices import Gpu, Inventory, MigDevice
from nvidia_device_plugin.events import Events, HealthChange
from nvidia_device_plugin.health.monitor import HealthMonitor
from nvidia_device_plugin.health.policy import REASON_DOUBLE_BIT_ECC, REASON_LOST, attribute_xid, xid_reason
from nvidia_device_plugin.health.registry import HealthRegistry
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.node import load_node, parse_node
from nvidia_device_plugin.nvml.simulator import SimulatedNvml

HEALTH_LOG = "nvidia_device_plugin.health"  # the package; the monitor logs as .health.monitor


class RecordingEvents(Events):
    """The typed events interface, recording every XID the monitor reports (its one boundary to metrics)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.xids: list[tuple[str, int, bool]] = []

    def xid_seen(self, gpu_uuid: str, xid: int, critical: bool) -> None:
        with self._lock:
            self.xids.append((gpu_uuid, xid, critical))

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.xids)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def wait_for(condition: Callable[[], bool], what: str, cap_s: float = 10.0) -> None:
    deadline = time.monotonic() + cap_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.002)


@dataclass
class Node:
    sim: SimulatedNvml
    inventory: Inventory
    registry: HealthRegistry = field(default_factory=HealthRegistry)
    changes: list[HealthChange] = field(default_factory=list)
    events: RecordingEvents = field(default_factory=RecordingEvents)
    monitors: list[HealthMonitor] = field(default_factory=list)

    def gpu(self, index: int) -> Gpu:
        return self.inventory.gpus[index]

    def monitor(self, policy: Health | None = None, **kwargs: Any) -> HealthMonitor:
        kwargs.setdefault("wait_timeout_ms", 20)
        kwargs.setdefault("poll_interval_s", 0.05)
        kwargs.setdefault("events", self.events)
        monitor = HealthMonitor(self.sim, self.inventory, policy or Health(), self.registry, **kwargs)
        self.monitors.append(monitor)
        monitor.start()
        return monitor

    def unhealthy(self) -> dict[str, str]:
        return self.registry.unhealthy()

    def wait_unhealthy(self, uuid: str) -> None:
        wait_for(lambda: uuid in self.unhealthy(), f"{uuid} to become unhealthy")

    def settle(self, monitor: HealthMonitor, marker_gpu: int) -> None:
        """Make sure the loop has run a whole step since now: two ignored XIDs (13) handled in turn."""
        for _ in range(2):
            target = self.events.count + 1
            self.sim.inject_xid(marker_gpu, 13)
            wait_for(lambda: self.events.count >= target, "the marker event")  # noqa: B023


def make_node(spec: Any) -> Iterator[Node]:
    sim = SimulatedNvml(spec)
    sim.nvmlInit()
    node = Node(sim=sim, inventory=discover(sim, sim.materialize_sysfs()))
    node.registry.subscribe(node.changes.append)
    yield node
    for monitor in node.monitors:
        monitor.stop()
    sim.nvmlShutdown()
    sim.close()
    assert not [t for t in threading.enumerate() if t.name == "nvml-health"]


@pytest.fixture
def dgx() -> Iterator[Node]:
    yield from make_node(load_node("dgx-a100"))


@pytest.fixture
def mig_node() -> Iterator[Node]:
    yield from make_node(load_node("a100-mig-mixed"))


@pytest.fixture
def no_events_node() -> Iterator[Node]:
    doc = {
        "name": "old-and-new",
        "gpus": [
            {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920},
            {"name": "Tesla K80", "memory_mib": 12288, "events": False},
        ],
    }
    yield from make_node(parse_node(doc, source="test"))


@pytest.fixture
def health_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger=HEALTH_LOG)
    return caplog


def lines(caplog: pytest.LogCaptureFixture, containing: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith(HEALTH_LOG + ".") and containing in r.getMessage()
    ]


# ---- pure policy ------------------------------------------------------------------------------------


def mig_gpu() -> Gpu:
    migs = tuple(
        MigDevice(
            uuid=f"MIG-{n}",
            index=n,
            parent_uuid="GPU-x",
            parent_index=0,
            profile="1g.10gb",
            memory_bytes=10 << 30,
            gpu_instance_id=gi,
            compute_instance_id=ci,
        )
        for n, (gi, ci) in enumerate([(1, 0), (2, 0), (2, 1)])
    )
    return Gpu(
        index=0,
        uuid="GPU-x",
        name="NVIDIA A100-SXM4-80GB",
        memory_bytes=80 << 30,
        pci_bus_id="00000000:07:00.0",
        minor=0,
        numa_node=0,
        mig_enabled=True,
        mig_devices=migs,
    )


def test_xid_attribution_to_mig_devices() -> None:
    gpu = mig_gpu()
    assert attribute_xid(gpu, 2, 1) == ["MIG-2"]
    assert attribute_xid(gpu, 2, None) == ["MIG-1", "MIG-2"]  # the whole GPU instance
    assert attribute_xid(gpu, None, None) == ["GPU-x"]
    assert attribute_xid(gpu, 7, 0) == ["GPU-x"]  # no such instance
    assert attribute_xid(gpu, 1, 5) == ["GPU-x"]
    whole = Gpu(**{**gpu.__dict__, "mig_enabled": False, "mig_devices": ()})
    assert attribute_xid(whole, 1, 0) == ["GPU-x"]


def test_every_xid_seen_reaches_the_events_interface(dgx: Node) -> None:
    dgx.monitor()
    dgx.sim.inject_xid(4, 79)  # critical under the default policy
    dgx.sim.inject_xid(5, 13)  # ignored by default
    dgx.sim.inject_ecc_double_bit(6)  # not an XID: not reported as one
    dgx.sim.inject_xid(7, 48)
    wait_for(lambda: dgx.events.count >= 3, "the XIDs to be reported")
    assert dgx.events.xids == [
        (dgx.gpu(4).uuid, 79, True),
        (dgx.gpu(5).uuid, 13, False),
        (dgx.gpu(7).uuid, 48, True),
    ]


def test_xid_reason_names_well_known_xids() -> None:
    assert xid_reason(79) == "XID 79 (GPU has fallen off the bus)"
    assert xid_reason(4242) == "XID 4242"


# ---- which XIDs count -------------------------------------------------------------------------------


def test_default_ignored_xids_leave_the_gpu_healthy(dgx: Node, health_log: pytest.LogCaptureFixture) -> None:
    monitor = dgx.monitor()
    for xid in sorted(DEFAULT_IGNORED_XIDS):
        dgx.sim.inject_xid(0, xid)
    dgx.settle(monitor, marker_gpu=0)
    assert dgx.unhealthy() == {}
    assert lines(health_log, "ignored XID 13")  # the first ignored one is logged with its device


def test_a_critical_xid_marks_the_gpu_once_with_one_log_line(
    dgx: Node, health_log: pytest.LogCaptureFixture
) -> None:
    monitor = dgx.monitor()
    gpu = dgx.gpu(3)
    dgx.sim.inject_xid(3, 79)
    dgx.sim.inject_xid(3, 79)
    dgx.sim.inject_xid(3, 48)
    dgx.wait_unhealthy(gpu.uuid)
    dgx.settle(monitor, marker_gpu=0)  # listeners and the log line run just after the state changes
    assert dgx.unhealthy() == {gpu.uuid: "XID 79 (GPU has fallen off the bus)"}
    assert dgx.changes == [HealthChange(gpu.uuid, False, "XID 79 (GPU has fallen off the bus)", 79)]
    logged = lines(health_log, "is unhealthy")
    assert len(logged) == 1
    assert gpu.uuid in logged[0] and "GPU 3" in logged[0] and "XID 79" in logged[0]


@pytest.mark.parametrize(
    ("policy", "critical", "not_critical"),
    [
        # A custom critical list: only those count.
        (Health(critical_xids=frozenset({79})), 79, 48),
        # DP_DISABLE_HEALTHCHECKS=48: an extra ignored XID on top of the defaults.
        (Health(ignored_xids=DEFAULT_IGNORED_XIDS | {48}), 79, 48),
        # DP_ENABLE_HEALTHCHECKS=31: a default-ignored XID turned back on.
        (Health(ignored_xids=DEFAULT_IGNORED_XIDS - {31}), 31, 13),
        # Nothing ignored at all.
        (Health(ignored_xids=frozenset()), 13, None),
    ],
)
def test_xid_policies(dgx: Node, policy: Health, critical: int, not_critical: int | None) -> None:
    dgx.monitor(policy)
    if not_critical is not None:
        dgx.sim.inject_xid(1, not_critical)
    dgx.sim.inject_xid(2, critical)
    # One event set delivers in order: once the second is handled, so was the first.
    dgx.wait_unhealthy(dgx.gpu(2).uuid)
    assert dgx.unhealthy() == {dgx.gpu(2).uuid: xid_reason(critical)}


def test_disabled_health_checks_start_no_thread(dgx: Node, health_log: pytest.LogCaptureFixture) -> None:
    dgx.monitor(Health(disabled=True))
    assert not [t for t in threading.enumerate() if t.name == "nvml-health"]
    dgx.sim.inject_xid(0, 79)
    dgx.sim.inject_ecc_double_bit(0)
    assert dgx.unhealthy() == {}
    assert len(lines(health_log, "disabled")) == 1


def test_double_bit_ecc_always_counts(dgx: Node) -> None:
    monitor = dgx.monitor(Health(critical_xids=frozenset({79})))
    dgx.sim.inject_ecc_double_bit(5)
    dgx.wait_unhealthy(dgx.gpu(5).uuid)
    dgx.settle(monitor, marker_gpu=0)
    assert dgx.unhealthy() == {dgx.gpu(5).uuid: REASON_DOUBLE_BIT_ECC}
    assert dgx.changes[0].xid is None


def test_event_types_select_what_is_registered(dgx: Node, health_log: pytest.LogCaptureFixture) -> None:
    dgx.monitor(Health(event_types=("EventTypeXidCriticalError", "EventTypeSingleBitEccError")))
    dgx.sim.inject_ecc_double_bit(5)  # not registered: never delivered
    dgx.sim.inject_xid(6, 79)
    dgx.wait_unhealthy(dgx.gpu(6).uuid)
    assert set(dgx.unhealthy()) == {dgx.gpu(6).uuid}


# ---- MIG and propagation ----------------------------------------------------------------------------


def test_an_attributable_xid_marks_only_that_mig_device(mig_node: Node) -> None:
    monitor = mig_node.monitor()
    gpu = mig_node.gpu(1)
    target = gpu.mig_devices[2]
    mig_node.sim.inject_xid(target.uuid, 94)
    mig_node.wait_unhealthy(target.uuid)
    mig_node.settle(monitor, marker_gpu=3)
    assert mig_node.unhealthy() == {target.uuid: "XID 94 (contained ECC error)"}


def test_an_unattributable_xid_marks_the_whole_mig_gpu(mig_node: Node) -> None:
    monitor = mig_node.monitor()
    gpu = mig_node.gpu(2)
    mig_node.sim.inject_xid(2, 94)
    mig_node.wait_unhealthy(gpu.uuid)
    mig_node.settle(monitor, marker_gpu=3)
    assert set(mig_node.unhealthy()) == {gpu.uuid}


# ---- lost GPUs, polling and recovery ---------------------------------------------------------------


def test_a_lost_gpu_is_found_by_polling_and_stays_unhealthy_without_recovery(
    dgx: Node, health_log: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    monitor = dgx.monitor(poll_interval_s=5.0, clock=clock)
    gpu = dgx.gpu(3)
    dgx.sim.set_lost(3, True)
    clock.advance(5)
    dgx.wait_unhealthy(gpu.uuid)
    assert dgx.unhealthy() == {gpu.uuid: REASON_LOST}
    dgx.sim.set_lost(3, False)
    clock.advance(5)
    wait_for(lambda: lines(health_log, "readable again") != [], "the GPU's return to be logged")
    clock.advance(10_000)
    dgx.settle(monitor, marker_gpu=0)
    assert dgx.unhealthy() == {gpu.uuid: REASON_LOST}
    assert len(lines(health_log, "is unhealthy")) == 1


def test_a_lost_gpu_comes_back_after_the_grace_period_when_recovery_is_on(dgx: Node) -> None:
    clock = FakeClock()
    policy = Health(recovery=Recovery(enabled=True, grace_period_seconds=60))
    monitor = dgx.monitor(policy, poll_interval_s=5.0, clock=clock)
    gpu = dgx.gpu(3)
    dgx.sim.set_lost(3, True)
    clock.advance(5)
    dgx.wait_unhealthy(gpu.uuid)
    clock.advance(120)  # still lost: the grace period does not run down while it is unreadable
    dgx.settle(monitor, marker_gpu=0)
    assert gpu.uuid in dgx.unhealthy()
    dgx.sim.set_lost(3, False)
    clock.advance(50)  # the grace period starts when it is seen readable, here
    dgx.settle(monitor, marker_gpu=0)
    clock.advance(50)
    dgx.settle(monitor, marker_gpu=0)
    assert gpu.uuid in dgx.unhealthy()
    clock.advance(15)
    wait_for(lambda: gpu.uuid not in dgx.unhealthy(), "the GPU to recover")
    dgx.settle(monitor, marker_gpu=0)
    assert [c.healthy for c in dgx.changes] == [False, True]
    # It is watched for events again.
    dgx.sim.inject_xid(3, 79)
    dgx.wait_unhealthy(gpu.uuid)


def test_recovery_waits_for_a_quiet_grace_period(dgx: Node, health_log: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    policy = Health(recovery=Recovery(enabled=True, grace_period_seconds=60))
    monitor = dgx.monitor(policy, poll_interval_s=5.0, clock=clock)
    gpu = dgx.gpu(1)
    dgx.sim.inject_xid(1, 79)
    dgx.wait_unhealthy(gpu.uuid)
    clock.advance(40)
    dgx.sim.inject_xid(1, 79)  # a new critical event restarts the grace period
    dgx.settle(monitor, marker_gpu=0)
    clock.advance(40)
    dgx.settle(monitor, marker_gpu=0)
    assert gpu.uuid in dgx.unhealthy()
    clock.advance(25)
    wait_for(lambda: gpu.uuid not in dgx.unhealthy(), "the GPU to recover")
    dgx.settle(monitor, marker_gpu=0)  # the line is logged just after the registry changes
    assert len(lines(health_log, "healthy again")) == 1


def test_recovery_needs_the_device_to_be_readable(dgx: Node) -> None:
    clock = FakeClock()
    policy = Health(recovery=Recovery(enabled=True, grace_period_seconds=60))
    monitor = dgx.monitor(policy, poll_interval_s=5.0, clock=clock)
    gpu = dgx.gpu(2)
    dgx.sim.inject_xid(2, 79)
    dgx.wait_unhealthy(gpu.uuid)
    dgx.sim.set_lost(2, True)
    clock.advance(100)
    dgx.settle(monitor, marker_gpu=0)
    assert dgx.unhealthy() == {gpu.uuid: "XID 79 (GPU has fallen off the bus)"}
    dgx.sim.set_lost(2, False)
    clock.advance(5)
    dgx.settle(monitor, marker_gpu=0)
    assert gpu.uuid in dgx.unhealthy()
    clock.advance(60)
    wait_for(lambda: gpu.uuid not in dgx.unhealthy(), "the GPU to recover")


def test_a_mig_device_recovers_on_its_own(mig_node: Node) -> None:
    clock = FakeClock()
    policy = Health(recovery=Recovery(enabled=True, grace_period_seconds=30))
    monitor = mig_node.monitor(policy, poll_interval_s=5.0, clock=clock)
    target = mig_node.gpu(0).mig_devices[4]
    mig_node.sim.inject_xid(target.uuid, 94)
    mig_node.wait_unhealthy(target.uuid)
    # Past the grace period, but NVML cannot read the MIG device once: it stays unhealthy for now.
    mig_node.sim.fail_next("nvmlDeviceGetMigDeviceHandleByIndex", pynvml.NVML_ERROR_NO_PERMISSION)
    clock.advance(31)
    mig_node.settle(monitor, marker_gpu=3)
    assert set(mig_node.unhealthy()) == {target.uuid}
    clock.advance(5)
    wait_for(lambda: mig_node.unhealthy() == {}, "the MIG device to recover")


def test_a_new_monitor_takes_over_devices_left_unhealthy(dgx: Node) -> None:
    clock = FakeClock()
    first = dgx.monitor(poll_interval_s=5.0, clock=clock)
    dgx.sim.inject_xid(4, 79)
    dgx.wait_unhealthy(dgx.gpu(4).uuid)
    first.stop()
    # A config reload turns recovery on: the XID seen by the first monitor can now recover.
    policy = Health(recovery=Recovery(enabled=True, grace_period_seconds=30))
    second = dgx.monitor(policy, poll_interval_s=5.0, clock=clock)
    clock.advance(20)
    dgx.settle(second, marker_gpu=0)
    assert set(dgx.unhealthy()) == {dgx.gpu(4).uuid}
    clock.advance(15)
    wait_for(lambda: dgx.unhealthy() == {}, "the adopted device to recover")


def test_recovery_off_keeps_an_xid_for_the_process_lifetime(dgx: Node) -> None:
    clock = FakeClock()
    monitor = dgx.monitor(poll_interval_s=5.0, clock=clock)
    dgx.sim.inject_xid(4, 79)
    dgx.wait_unhealthy(dgx.gpu(4).uuid)
    clock.advance(1e9)
    dgx.settle(monitor, marker_gpu=0)
    assert set(dgx.unhealthy()) == {dgx.gpu(4).uuid}


def test_a_gpu_without_event_support_is_reported_once_and_polled(
    no_events_node: Node, health_log: pytest.LogCaptureFixture
) -> None:
    node = no_events_node
    monitor = node.monitor(poll_interval_s=0.01)
    old = node.gpu(1)
    node.sim.inject_xid(1, 79)  # never delivered: the K80 is not registered
    node.settle(monitor, marker_gpu=0)
    assert node.unhealthy() == {}
    node.sim.set_lost(1, True)
    node.wait_unhealthy(old.uuid)
    assert node.unhealthy() == {old.uuid: REASON_LOST}
    reported = lines(health_log, "XIDs cannot be watched")
    assert len(reported) == 1 and old.uuid in reported[0]
    # The other GPU still has its events.
    node.sim.inject_xid(0, 79)
    node.wait_unhealthy(node.gpu(0).uuid)


def test_a_gpu_lost_at_start_is_marked(dgx: Node) -> None:
    dgx.sim.set_lost(6, True)
    dgx.monitor(clock=FakeClock())
    assert dgx.unhealthy() == {dgx.gpu(6).uuid: REASON_LOST}


def test_an_event_from_a_lost_gpu_triggers_a_liveness_check(dgx: Node) -> None:
    dgx.monitor(clock=FakeClock())  # the clock never moves: no periodic poll
    dgx.sim.set_lost(2, True)
    dgx.sim.inject_xid(2, 79)  # the monitor cannot read the event's device
    dgx.wait_unhealthy(dgx.gpu(2).uuid)
    assert dgx.unhealthy() == {dgx.gpu(2).uuid: REASON_LOST}


# ---- NVML errors ------------------------------------------------------------------------------------


def test_wait_errors_do_not_kill_the_monitor(dgx: Node, health_log: pytest.LogCaptureFixture) -> None:
    dgx.sim.fail_next("nvmlEventSetWait_v2", pynvml.NVML_ERROR_UNKNOWN, 3)
    dgx.monitor()
    wait_for(lambda: lines(health_log, "works again") != [], "the wait to work again")
    assert len(lines(health_log, "waiting for NVML events failed")) == 1
    dgx.sim.inject_xid(0, 79)
    dgx.wait_unhealthy(dgx.gpu(0).uuid)
    assert [t for t in threading.enumerate() if t.name == "nvml-health"]


def test_a_gpu_is_lost_wait_error_finds_the_lost_gpu(dgx: Node) -> None:
    dgx.monitor(clock=FakeClock())
    dgx.sim.set_lost(5, True)
    dgx.sim.fail_next("nvmlEventSetWait_v2", pynvml.NVML_ERROR_GPU_IS_LOST, 2)
    dgx.wait_unhealthy(dgx.gpu(5).uuid)
    assert dgx.unhealthy() == {dgx.gpu(5).uuid: REASON_LOST}
    # The event set was rebuilt without it; the others are still watched.
    dgx.sim.inject_xid(0, 79)
    dgx.wait_unhealthy(dgx.gpu(0).uuid)


def test_a_failing_event_set_leaves_liveness_polling(dgx: Node, health_log: pytest.LogCaptureFixture) -> None:
    dgx.sim.fail_next("nvmlEventSetCreate", pynvml.NVML_ERROR_UNKNOWN)
    dgx.monitor(poll_interval_s=0.01)
    assert len(lines(health_log, "cannot create an NVML event set")) == 1
    dgx.sim.set_lost(7, True)
    dgx.wait_unhealthy(dgx.gpu(7).uuid)


def test_a_probe_error_that_does_not_mean_lost_changes_nothing(
    dgx: Node, health_log: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    monitor = dgx.monitor(poll_interval_s=5.0, clock=clock)
    dgx.sim.fail_next("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_NO_PERMISSION, 3)
    clock.advance(5)
    dgx.settle(monitor, marker_gpu=0)
    assert dgx.unhealthy() == {}
    assert len(lines(health_log, "cannot check")) == 1


# ---- storms and shutdown ----------------------------------------------------------------------------


def test_an_event_storm_is_handled_in_bounded_memory_and_ends_in_the_right_state(
    dgx: Node, health_log: pytest.LogCaptureFixture
) -> None:
    monitor = dgx.monitor()
    tracemalloc.start()
    try:
        for n in range(9_998):
            dgx.sim.inject_xid(n % 8, (13, 31, 43)[n % 3])
        dgx.sim.inject_xid(2, 79)
        dgx.sim.inject_xid(7, 48)
        wait_for(lambda: dgx.events.count >= 10_000, "the storm to be processed", cap_s=60)
        dgx.settle(monitor, marker_gpu=0)
        held = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, "*nvidia_device_plugin/health*.py")]
        )
        retained = sum(stat.size for stat in held.statistics("filename"))
    finally:
        tracemalloc.stop()
    assert set(dgx.unhealthy()) == {dgx.gpu(2).uuid, dgx.gpu(7).uuid}
    assert [c.uuid for c in dgx.changes] == [dgx.gpu(2).uuid, dgx.gpu(7).uuid]
    assert retained < 64 * 1024, f"the monitor holds {retained} bytes after a storm"
    assert len(lines(health_log, "ignored")) <= 2


def test_ignored_xid_storm_is_summed_up_once_per_window(
    dgx: Node, health_log: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    dgx.monitor(poll_interval_s=1e6, clock=clock)
    for _ in range(500):
        dgx.sim.inject_xid(1, 31)
    wait_for(lambda: dgx.events.count >= 500, "the ignored XIDs")
    clock.advance(61)
    wait_for(lambda: lines(health_log, "more non-critical") != [], "the summary line")
    summary = lines(health_log, "more non-critical")
    assert len(summary) == 1 and "XID 31 x" in summary[0]
    assert len(lines(health_log, "ignored")) == 2


def test_many_distinct_ignored_xids_keep_the_summary_bounded(
    dgx: Node, health_log: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    dgx.monitor(Health(critical_xids=frozenset({79})), poll_interval_s=1e6, clock=clock)
    for xid in range(1000, 1101):
        dgx.sim.inject_xid(0, xid)
    wait_for(lambda: dgx.events.count >= 101, "the ignored XIDs")
    clock.advance(61)
    wait_for(lambda: lines(health_log, "more non-critical") != [], "the summary line")
    (summary,) = lines(health_log, "more non-critical")
    assert "ignored 100 more" in summary and "other XIDs x68" in summary
    assert summary.count("XID 1") == 32


def test_stop_returns_promptly_and_leaves_no_thread(dgx: Node) -> None:
    # An hour-long wait: stop() returns only because it interrupts the (simulated) wait, not by a timeout.
    monitor = dgx.monitor(wait_timeout_ms=3_600_000)
    assert [t for t in threading.enumerate() if t.name == "nvml-health"]
    monitor.stop()
    assert not [t for t in threading.enumerate() if t.name == "nvml-health"]
    monitor.stop()  # idempotent


def test_stop_while_backing_off_from_wait_errors(dgx: Node, health_log: pytest.LogCaptureFixture) -> None:
    dgx.sim.fail_next("nvmlEventSetWait_v2", pynvml.NVML_ERROR_UNKNOWN, 1000)
    monitor = dgx.monitor(wait_timeout_ms=50)
    wait_for(lambda: lines(health_log, "waiting for NVML events failed") != [], "the monitor to back off")
    monitor.stop()
    assert not [t for t in threading.enumerate() if t.name == "nvml-health"]

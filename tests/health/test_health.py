"""The health monitor against a simulated node: which events count, MIG, lost GPUs, recovery, NVML errors."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from nvidia_device_plugin.config.v1 import DEFAULT_IGNORED_XIDS, Health, Recovery
from nvidia_device_plugin.events import CauseKind, HealthCause, HealthChange
from nvidia_device_plugin.health.policy import REASON_DOUBLE_BIT_ECC, REASON_LOST, xid_reason
from nvidia_device_plugin.nvml.sim.node import load_node, parse_node

from support.health_support import FakeClock, Node, lines, make_node
from support.threads import threads_named
from support.waiting import wait_for


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
    assert dgx.changes == [
        HealthChange(gpu.uuid, False, HealthCause(CauseKind.XID, "XID 79 (GPU has fallen off the bus)", 79))
    ]
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
    assert not threads_named("nvml-health")
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
    assert threads_named("nvml-health")


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

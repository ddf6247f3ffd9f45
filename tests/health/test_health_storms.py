"""The health monitor under event storms, and stopping it."""

from __future__ import annotations

import threading
import tracemalloc

import pynvml
import pytest

from nvidia_device_plugin.config.v1 import Health

from support.health_support import FakeClock, Node, lines
from support.waiting import scaled, wait_for

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
        wait_for(lambda: dgx.events.count >= 10_000, "the storm to be processed", timeout=scaled(60))
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

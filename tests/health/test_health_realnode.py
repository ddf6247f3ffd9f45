"""Health on real drivers: transient probe errors, recovery that checks what NVML can tell, MIG in
unprivileged containers, GPU_IS_LOST from the event wait."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from nvidia_device_plugin.config.v1 import Health, Recovery
from nvidia_device_plugin.health.monitor import LOST_AFTER_FAILED_PROBES
from nvidia_device_plugin.health.policy import REASON_LOST
from nvidia_device_plugin.nvml.sim.node import load_node, parse_node
from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml

from support.health_support import FakeClock, Node, lines, make_node
from support.waiting import wait_for


def _poll(node: Node, clock: FakeClock, monitor: object) -> None:
    clock.advance(5)
    node.settle(monitor, marker_gpu=0)  # type: ignore[arg-type]


def test_one_unknown_probe_error_does_not_lose_a_gpu_but_consecutive_ones_do(dgx: Node) -> None:
    clock = FakeClock()
    monitor = dgx.monitor(poll_interval_s=5.0, clock=clock)
    gpu = dgx.gpu(3)
    dgx.sim.fail_always("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_UNKNOWN, gpu=3)
    _poll(dgx, clock, monitor)
    dgx.sim.clear_failures()
    _poll(dgx, clock, monitor)
    assert dgx.unhealthy() == {}
    dgx.sim.fail_always("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_UNKNOWN, gpu=3)
    for _ in range(LOST_AFTER_FAILED_PROBES - 1):
        _poll(dgx, clock, monitor)
    assert dgx.unhealthy() == {}
    clock.advance(5)
    dgx.wait_unhealthy(gpu.uuid)
    assert dgx.unhealthy() == {gpu.uuid: REASON_LOST}


@pytest.mark.parametrize("fault", ["ecc", "remap-failed", "remap-pending", "recovery-action"])
def test_recovery_waits_for_what_nvml_says_about_the_gpu(
    dgx: Node, health_log: pytest.LogCaptureFixture, fault: str
) -> None:
    clock = FakeClock()
    policy = Health(recovery=Recovery(enabled=True, grace_period_seconds=6))
    monitor = dgx.monitor(policy, poll_interval_s=5.0, clock=clock)
    gpu = dgx.gpu(2)
    dgx.sim.inject_xid(2, 48)
    dgx.wait_unhealthy(gpu.uuid)
    if fault == "ecc":
        dgx.sim.set_ecc_uncorrected(2, 7)  # rose after the fault
    elif fault == "remap-failed":
        dgx.sim.set_remapped_rows(2, pending=False, failure=True)
    elif fault == "remap-pending":
        dgx.sim.set_remapped_rows(2, pending=True, failure=False)
    else:
        dgx.sim.set_recovery_action(2, 2)
    for _ in range(4):
        _poll(dgx, clock, monitor)
    assert gpu.uuid in dgx.unhealthy()
    assert len(lines(health_log, "stays unhealthy")) == 1
    if fault == "ecc":
        dgx.sim.inject_xid(2, 48)  # a new fault: its count is the new baseline only after a reset
        dgx.sim.set_ecc_uncorrected(2, 7)
    dgx.sim.set_remapped_rows(2, pending=False, failure=False)
    dgx.sim.set_recovery_action(2, 0)
    if fault == "ecc":
        return  # the count never falls without a reset: it stays out, as it should
    clock.advance(10)
    wait_for(lambda: gpu.uuid not in dgx.unhealthy(), "the GPU to return once NVML has nothing against it")


def test_readable_again_says_the_gpu_is_still_unhealthy(
    dgx: Node, health_log: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    policy = Health(recovery=Recovery(enabled=True, grace_period_seconds=6))
    dgx.monitor(policy, poll_interval_s=5.0, clock=clock)
    dgx.sim.set_lost(3, True)
    clock.advance(5)
    dgx.wait_unhealthy(dgx.gpu(3).uuid)
    dgx.sim.set_lost(3, False)
    clock.advance(5)
    wait_for(lambda: lines(health_log, "readable again") != [], "the return to be logged")
    (line,) = lines(health_log, "readable again")
    assert "still unhealthy" in line and "stays healthy" not in line


def test_gpu_is_lost_from_the_event_wait_marks_the_lost_gpu() -> None:
    sim = SimulatedNvml(load_node("dgx-a100"), lost_fails_event_wait=True)
    node_iter = _node(sim)
    node = next(node_iter)
    node.monitor(poll_interval_s=3600.0)
    sim.set_lost(5, True)
    node.wait_unhealthy(node.gpu(5).uuid)
    assert set(node.unhealthy()) == {node.gpu(5).uuid}
    next(node_iter, None)


def test_unprivileged_container_warns_once_per_mig_gpu_and_keeps_running(
    health_log: pytest.LogCaptureFixture,
) -> None:
    doc = {
        "unprivileged_container": True,
        "gpus": [
            {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "mig": ["1g.10gb"]},
            {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "mig": ["1g.10gb"]},
            {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920},
        ],
    }
    node_iter = make_node(parse_node(doc, "container"))
    node = next(node_iter)
    monitor = node.monitor()
    node.settle(monitor, marker_gpu=2)
    warnings = lines(health_log, "CAP_SYS_ADMIN")
    assert len(warnings) == 2 and "GPU 0" in warnings[0] and "GPU 1" in warnings[1]
    node.sim.inject_xid(2, 79)
    node.wait_unhealthy(node.gpu(2).uuid)
    next(node_iter, None)


def _node(sim: SimulatedNvml) -> Iterator[Node]:
    from nvidia_device_plugin.nvml.discovery import discover

    sim.nvmlInit()
    node = Node(sim=sim, inventory=discover(sim, sim.materialize_host().sysfs_root))
    yield node
    for monitor in node.monitors:
        monitor.stop()
    sim.close()

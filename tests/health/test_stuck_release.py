"""A GPU whose stuck NVML call the driver answers at last comes back as promptly as one never stuck: the
monitor checks it at its next step, not at its next poll (health/monitor.py, nvml/bounded.py)."""

from __future__ import annotations

from nvidia_device_plugin.config.v1 import Health, Recovery
from nvidia_device_plugin.health.monitor import HealthMonitor
from nvidia_device_plugin.health.registry import HealthRegistry
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.session import open_nvml

from support.health_support import FakeClock
from support.waiting import NVML_CALL_DEADLINE_S, wait_for

POLL_S = 5.0  # the liveness poll; the fake clock never reaches a second one


def test_a_gpu_whose_stuck_call_returns_is_checked_at_once_and_recovers() -> None:
    with open_nvml("dgx-a100", call_timeout_s=NVML_CALL_DEADLINE_S) as session:
        assert session.simulator is not None
        inventory = discover(session.nv, session.host.sysfs_root)
        registry = HealthRegistry()
        clock = FakeClock()
        policy = Health(recovery=Recovery(enabled=True, grace_period_seconds=0.0))
        monitor = HealthMonitor(
            session.nv, inventory, policy, registry, wait_timeout_ms=20, poll_interval_s=POLL_S, clock=clock
        )
        uuid = inventory.gpus[2].uuid
        session.simulator.hang("nvmlDeviceGetMemoryInfo", 2)  # a GPU reset: its liveness check hangs
        monitor.start()
        try:
            clock.advance(POLL_S)  # the one poll: GPU 2's check gets stuck at its deadline
            wait_for(lambda: uuid in registry.unhealthy(), "GPU 2 to be unhealthy while its call is stuck")
            assert "nvmlDeviceGetMemoryInfo" in registry.unhealthy()[uuid]
            session.simulator.release("nvmlDeviceGetMemoryInfo", 2)  # the driver answers at last
            wait_for(lambda: uuid not in registry.unhealthy(), "GPU 2 back without waiting for a poll")
        finally:
            monitor.stop()

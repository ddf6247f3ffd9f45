"""The simulated node, recording events interface, clock and helpers the health-monitor tests share."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from nvidia_device_plugin.config.v1 import Health
from nvidia_device_plugin.devices import Gpu, Inventory
from nvidia_device_plugin.events import Events, HealthChange
from nvidia_device_plugin.health.monitor import HealthMonitor
from nvidia_device_plugin.health.registry import HealthRegistry
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml

from support.waiting import wait_for

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
    node = Node(sim=sim, inventory=discover(sim, sim.materialize_host().sysfs_root))
    node.registry.subscribe(node.changes.append)
    yield node
    for monitor in node.monitors:
        monitor.stop()
    sim.nvmlShutdown()
    sim.close()
    assert not [t for t in threading.enumerate() if t.name == "nvml-health"]


def lines(caplog: pytest.LogCaptureFixture, containing: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith(HEALTH_LOG + ".") and containing in r.getMessage()
    ]

"""Serving one ResourcePlan through the framework: health-aware device lists, Allocate and preferences."""

from __future__ import annotations

from collections.abc import Sequence

from nvidia_device_plugin.allocation import AllocationIndex, AllocationSettings, allocate
from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.health.registry import HealthRegistry
from nvidia_device_plugin.plugin.server import DeviceState
from nvidia_device_plugin.preferred import preferred_allocation
from nvidia_device_plugin.resources import ResourcePlan


class GpuResourceBackend:
    """ResourceBackend for one advertised NVIDIA resource."""

    def __init__(
        self,
        plan: ResourcePlan,
        inventory: Inventory,
        settings: AllocationSettings,
        registry: HealthRegistry,
    ) -> None:
        self.plan = plan
        self.inventory = inventory
        self.settings = settings
        self.registry = registry
        self._index = AllocationIndex(plan, inventory)

    def devices(self) -> Sequence[DeviceState]:
        healthy = self.registry.is_healthy
        return [DeviceState(d.id, healthy(d), d.numa_node) for d in self.plan.devices]

    def allocate(self, requests: Sequence[Sequence[str]]) -> pb.AllocateResponse:
        return allocate(
            self.plan,
            requests,
            self.settings,
            unhealthy=self.registry,  # asked per requested device; no copy of the unhealthy map
            inventory=self.inventory,
            index=self._index,
        )

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        return preferred_allocation(
            self.plan,
            self.inventory,
            available,
            must_include,
            size,
            policy=self.settings.shared_devices_allocation_policy,
        )

"""Serving one ResourcePlan through the framework: health-aware device lists, Allocate and preferences."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from nvidia_device_plugin.allocation import AllocationIndex, AllocationSettings, allocate
from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.health_state import HealthRegistry
from nvidia_device_plugin.plugin.server import DeviceState
from nvidia_device_plugin.preferred import preferred_allocation
from nvidia_device_plugin.resources import AdvertisedDevice, ResourcePlan


class _UnhealthyIds:
    """The plan's unhealthy device IDs, looked up on demand: Allocate asks about a few IDs, not all 800."""

    def __init__(self, by_id: dict[str, AdvertisedDevice], registry: HealthRegistry) -> None:
        self._by_id = by_id
        self._registry = registry

    def __contains__(self, device_id: object) -> bool:
        device = self._by_id.get(device_id) if isinstance(device_id, str) else None
        return device is not None and not self._registry.is_healthy(device)

    def __iter__(self) -> Iterator[str]:
        return (i for i, d in self._by_id.items() if not self._registry.is_healthy(d))

    def __len__(self) -> int:
        return sum(1 for _ in self)


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
        self._unhealthy = _UnhealthyIds({d.id: d for d in plan.devices}, registry)
        self._index = AllocationIndex(plan, inventory)

    def devices(self) -> Sequence[DeviceState]:
        healthy = self.registry.is_healthy
        return [DeviceState(d.id, healthy(d), d.numa_node) for d in self.plan.devices]

    def allocate(self, requests: Sequence[Sequence[str]]) -> pb.AllocateResponse:
        return allocate(
            self.plan,
            requests,
            self.settings,
            unhealthy=self._unhealthy,
            inventory=self.inventory,
            index=self._index,
        )

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        return preferred_allocation(self.plan, self.inventory, available, must_include, size)

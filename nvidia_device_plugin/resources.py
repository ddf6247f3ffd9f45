"""Inventory + config -> the resources this node advertises and the device IDs inside each.

This module is the one place that builds and parses advertised device IDs (`<uuid>::<replica>`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

REPLICA_SEPARATOR = "::"


def replica_id(physical_uuid: str, replica: int) -> str:
    return f"{physical_uuid}{REPLICA_SEPARATOR}{replica}"


def physical_uuid_of(device_id: str) -> str:
    """The GPU or MIG UUID behind an advertised ID (the ID itself when it is not a replica)."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


@dataclass(frozen=True)
class AdvertisedDevice:
    """One device ID kubelet sees, and the physical device behind it."""

    id: str
    kind: Literal["gpu", "mig"]
    physical_uuid: str  # what goes into NVIDIA_VISIBLE_DEVICES: GPU UUID or MIG UUID
    gpu_uuid: str  # the physical GPU it lives on (== physical_uuid for whole GPUs)
    gpu_index: int
    mig_index: int | None  # index among the GPU's MIG devices; None for whole GPUs
    replica: int | None  # replica number when shared; None otherwise
    numa_node: int | None
    memory_bytes: int  # of the physical device behind it (GPU or MIG slice), before sharing

    @property
    def index_id(self) -> str:
        """The `index` device-ID strategy's name for the physical device: "3" or "3:1" for MIG."""
        if self.mig_index is None:
            return str(self.gpu_index)
        return f"{self.gpu_index}:{self.mig_index}"


@dataclass(frozen=True)
class ResourcePlan:
    """One advertised resource (one gRPC server, one kubelet registration)."""

    name: str  # fully qualified, e.g. "nvidia.com/gpu" or "nvidia.com/mig-1g.10gb"
    devices: tuple[AdvertisedDevice, ...]
    sharing: Literal["none", "time-slicing", "mps"] = "none"
    replicas: int = 1  # replicas per physical device when shared
    fail_requests_greater_than_one: bool = False

    @property
    def socket_name(self) -> str:
        """Socket file name in the device-plugin directory, as NVIDIA's plugin names it (nvidia-gpu.sock)."""
        prefix, _, short = self.name.rpartition("/")
        base = short if prefix == "nvidia.com" else self.name.replace("/", "-")
        return f"nvidia-{base}.sock"

    def device(self, device_id: str) -> AdvertisedDevice | None:
        for dev in self.devices:
            if dev.id == device_id:
                return dev
        return None


def physical_uuids(devices: Iterable[AdvertisedDevice]) -> list[str]:
    """Physical UUIDs behind `devices`, deduplicated, first occurrence order kept."""
    seen: dict[str, None] = {}
    for dev in devices:
        seen.setdefault(dev.physical_uuid, None)
    return list(seen)

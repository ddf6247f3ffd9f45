"""The one pipeline: an NVML session and a config -> the inventory -> the resource plans served.

Everything that needs "what would this node advertise" calls `build_snapshot`: the daemon at start and on
every reload, `plan`, `demo`, the benchmarks and the tests. A Snapshot is replaced whole, never mutated, so
a reader (a gRPC call, a scrape) always sees one consistent moment.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvidia_device_plugin.allocation import AllocationSettings
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.nvml.backend import NvmlSession
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.resources import ResourcePlan, build_resources


@dataclass(frozen=True)
class Snapshot:
    """What is served right now: the config, what discovery found, and the plans built from both."""

    config: Config
    inventory: Inventory
    plans: tuple[ResourcePlan, ...]
    allocation: AllocationSettings


def build_snapshot(session: NvmlSession, config: Config) -> Snapshot:
    """Discover the node through `session` and expand it under `config`.

    Raises NvmlError when discovery fails and ConfigError / InventoryError when the config cannot be
    applied to what was found.
    """
    inventory = discover(session.nv, session.sysfs_root)
    plans = build_resources(inventory, config)
    return Snapshot(config, inventory, plans, AllocationSettings.from_config(config))

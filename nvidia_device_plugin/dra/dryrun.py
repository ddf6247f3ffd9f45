"""`dra plan`: the ResourceSlices and DeviceClasses a node would publish, without a cluster.

The GPUs are given to their configured owner at once (a running daemon hands them over only once they are
free, dra/ownership.py), and no device is tainted (no health is watched).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from nvidia_device_plugin.dra.attributes import Json
from nvidia_device_plugin.dra.classes import device_classes
from nvidia_device_plugin.dra.ownership import DRA, wanted_owners
from nvidia_device_plugin.dra.slices import node_counter_sets, node_devices, planned_slices
from nvidia_device_plugin.snapshot import Snapshot

DEFAULT_NODE_NAME = "node"


@dataclass(frozen=True)
class DryRun:
    slices: list[Json]
    classes: list[Json]
    owned: tuple[int, ...]  # indices of the GPUs DRA would own
    enabled: bool  # dra.enabled: whether a daemon with this config publishes them


def dry_run(snapshot: Snapshot, node: str = DEFAULT_NODE_NAME) -> DryRun:
    """What `snapshot`'s node publishes once DRA owns the GPUs `dra.gpus` names (when dra.enabled is off,
    as if it were on: the plan of turning it on). With `dra.dynamicMig`, the counter sets of the GPUs that
    publish MIG partitions come first, in slices of their own."""
    dra = snapshot.config.dra
    owners = wanted_owners(snapshot.inventory, dra if dra.enabled else replace(dra, enabled=True))
    owned = {uuid for uuid, side in owners.items() if side == DRA}
    inventory, dynamic = snapshot.inventory, dra.dynamic_mig
    devices = node_devices(inventory, snapshot.plans, owned, dynamic_mig=dynamic)
    slices = planned_slices(node, devices, node_counter_sets(inventory, owned, dynamic))
    indices = tuple(sorted(g.index for g in inventory.gpus if g.uuid in owned))
    return DryRun(slices, device_classes(snapshot.plans), indices, dra.enabled)

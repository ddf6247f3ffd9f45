"""One owner per GPU: which GPUs the config gives DRA, and the handover that moves a GPU between sides.

The config (`dra.gpus`) says who should own each GPU; the handover (dra/mode.py) moves a GPU only once
nothing on the side it leaves still uses it, so that no GPU is ever served by both sides at once (the
scheduler counts Node allocatable and ResourceSlices separately, and would admit a pod on each):

* device plugin -> DRA: the GPU leaves the device plugin's lists at once (no new pod gets it); it enters
  the ResourceSlice once kubelet's pod-resources API shows no running pod holding any ID that names it
  (`gpus_held`: under any resource name, since a pod keeps the name of the config that admitted it), on
  two readings in a row (an Allocate in flight at the first one shows by the second).
* DRA -> device plugin: the GPU leaves the ResourceSlice at once; it enters the device plugin's lists
  once the published slices no longer hold it and no claim holds it (pod-resources, the kubelet DRA
  plugin's prepared claims, a per-claim CDI spec on disk: dra/claims_on_disk.py), on two readings in a row.
* At start every GPU is "moving" to its configured owner: the previous run may have left it with the
  other side.
* A reading that fails, or that comes too soon after kubelet came back (dra/podresources.py), moves
  nothing and breaks the row (`interrupt`).

While moving a GPU is served by neither side. `Owners` holds the effective owner of each GPU and decides
each step (`step`); it does no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Literal

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.dra import ALL_GPUS, Dra
from nvidia_device_plugin.config.v1 import RESOURCE_PREFIX
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.plans.resources import physical_uuid_of

Side = Literal["device-plugin", "dra"]
DEVICE_PLUGIN: Side = "device-plugin"
DRA: Side = "dra"
# Consecutive readings that must find a GPU free before it moves.
FREE_READINGS = 2


def wanted_owners(inventory: Inventory, dra: Dra) -> dict[str, Side]:
    """GPU UUID -> the side the config gives it. Raises ConfigError for a ref no GPU here answers to."""
    if not dra.enabled:
        return dict.fromkeys((g.uuid for g in inventory.gpus), DEVICE_PLUGIN)
    if dra.gpus == ALL_GPUS:
        return dict.fromkeys((g.uuid for g in inventory.gpus), DRA)
    by_ref = {str(g.index): g.uuid for g in inventory.gpus} | {g.uuid.lower(): g.uuid for g in inventory.gpus}
    missing = [ref for ref in dra.gpus if ref not in by_ref]
    if missing:
        raise ConfigError(
            f"dra.gpus names GPU {missing[0]}, which this node does not have (GPUs here: "
            f"{', '.join(str(g.index) for g in sorted(inventory.gpus, key=lambda g: g.index))})"
        )
    owned = {by_ref[ref] for ref in dra.gpus}
    return {g.uuid: DRA if g.uuid in owned else DEVICE_PLUGIN for g in inventory.gpus}


def gpus_held(plugin_ids: Mapping[str, Collection[str]], inventory: Inventory) -> frozenset[str]:
    """The GPUs of this node that running pods hold through device-plugin IDs, whatever resource name they
    were allocated under: a pod keeps the name of the config that admitted it, and a later config may have
    renamed the resource (time-slicing `renameByDefault`, a `rename`, a MIG strategy change).

    An ID names a GPU as a GPU UUID, a replica `<uuid>::<n>`, a MIG UUID (its parent GPU), a legacy MIG
    name `MIG-<GPU UUID>/<gi>/<ci>`, or, under an nvidia.com/ name only (another vendor's "0" is not
    ours), the `index` strategy's "3" or "3:1". An ID naming no GPU of this node holds none.
    """
    by_index = {str(g.index): g.uuid for g in inventory.gpus}
    held = set()
    for resource, ids in plugin_ids.items():
        ours = resource.startswith(f"{RESOURCE_PREFIX}/")
        for device_id in ids:
            if (uuid := _gpu_named(device_id, inventory, by_index if ours else {})) is not None:
                held.add(uuid)
    return frozenset(held)


def _gpu_named(device_id: str, inventory: Inventory, by_index: Mapping[str, str]) -> str | None:
    physical = physical_uuid_of(device_id)
    if (gpu := inventory.gpu_of(physical)) is not None:
        return gpu.uuid
    if physical.startswith("MIG-") and "/" in physical:  # MIG-GPU-<uuid>/<gi>/<ci> (drivers before R470)
        legacy = inventory.gpu(physical.removeprefix("MIG-").split("/", 1)[0])
        return legacy.uuid if legacy is not None else None
    return by_index.get(physical.split(":", 1)[0])


@dataclass(frozen=True)
class Reading:
    """What one look at the node found: the GPUs something on each side still holds."""

    held_by_device_plugin: frozenset[str]  # GPUs with device-plugin IDs assigned to running pods
    held_by_dra: frozenset[str]  # GPUs with a DRA claim (pod-resources, or prepared by our plugin)
    published: frozenset[str]  # GPUs in the ResourceSlices the API server holds now


@dataclass
class Owners:
    """The effective owner of each GPU (absent: moving, served by neither) and the handover's progress."""

    effective: dict[str, Side] = field(default_factory=dict)
    wanted: dict[str, Side] = field(default_factory=dict)
    free_for: dict[str, int] = field(default_factory=dict)  # GPU -> consecutive free readings

    def want(self, wanted: Mapping[str, Side]) -> bool:
        """Take the config's owners; a GPU whose owner changes leaves its side now. True on a change."""
        changed = False
        for uuid in list(self.effective):
            if uuid not in wanted or wanted[uuid] != self.effective[uuid]:
                del self.effective[uuid]
                self.free_for.pop(uuid, None)
                changed = True
        for uuid in list(self.free_for):
            if wanted.get(uuid) != self.wanted.get(uuid):
                self.free_for.pop(uuid)
        self.wanted = dict(wanted)
        return changed

    def moving(self) -> dict[str, Side]:
        """GPU -> the side it is moving to."""
        return {uuid: side for uuid, side in self.wanted.items() if uuid not in self.effective}

    def step(self, reading: Reading) -> list[str]:
        """Move the GPUs `reading` finds free for long enough; the GPUs that moved."""
        moved = []
        for uuid, side in self.moving().items():
            if _free(uuid, side, reading):
                self.free_for[uuid] = self.free_for.get(uuid, 0) + 1
            else:
                self.free_for[uuid] = 0
            if self.free_for[uuid] >= FREE_READINGS:
                self.effective[uuid] = side
                del self.free_for[uuid]
                moved.append(uuid)
        return moved

    def interrupt(self) -> None:
        """A reading that could not be made or trusted: the free readings so far no longer count."""
        self.free_for.clear()

    def served_by(self, side: Side) -> frozenset[str]:
        return frozenset(uuid for uuid, owner in self.effective.items() if owner == side)


def _free(uuid: str, side: Side, reading: Reading) -> bool:
    if side == DRA:
        return uuid not in reading.held_by_device_plugin
    return uuid not in reading.held_by_dra and uuid not in reading.published


def all_device_plugin(gpus: Collection[str]) -> Owners:
    """DRA off from the start: every GPU is the device plugin's, with no handover to wait for."""
    effective = dict.fromkeys(gpus, DEVICE_PLUGIN)
    return Owners(effective=effective, wanted=dict(effective))

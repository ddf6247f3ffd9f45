"""Inventory + config -> the resource plans this node serves (`build_resources`).

resources.py names each physical device's resource before sharing; this module leaves out the GPUs that
break the MIG strategy (mig_layout.py says which, and why), applies sharing, and refuses what cannot be
served. It follows NVIDIA's k8s-device-plugin (internal/rm/device_map.go, rm.go; api/config/v1):

* MIG strategy `single`: MIG mode must be on for all GPUs or for none (none: same as `none`), and every
  MIG device must have the same profile. GPUs that break the strategy's rules are left out and the rest
  served.
* Sharing: each entry of the active `sharing.timeSlicing` / `sharing.mps` list turns the selected
  devices of the named resource into `replicas` IDs each (`<uuid>::<n>`), under `rename`, or
  `<name>.shared` with renameByDefault, or else the same name. Devices the entries do not select stay
  advertised, unshared, under their resource's name (so one resource can hold both).

NVIDIA's plugin (v0.20 too) drops `resources` renames and per-entry renames and device lists at start-up;
so does the config loader here unless `flags.resourceNaming` is true (config/naming.py). What reaches this
module takes effect, as NVIDIA's resource manager would apply it.

Choices where NVIDIA is silent, buggy or random, made to be predictable:

* A `devices` selection uses its refs if any, else its count, else `all`.
* "The first `count` devices" are the first in GPU index (then MIG index) order; NVIDIA takes them
  in Go map order, which is random.
* A sharing entry naming a resource this node does not have is skipped, as NVIDIA does: one ConfigMap
  often serves a heterogeneous cluster (an `nvidia.com/a100` entry on a T4 node). But a `devices` ref
  (index, "g:m", UUID) that does not resolve within a resource the node does have is a ConfigError, as
  in NVIDIA, with a message that says where the device is advertised instead, if anywhere. Per-node
  device lists belong in per-node configs (NVIDIA's `nvidia.com/device-plugin.config` node label).
* Two entries for one resource (a Config built in code may hold them; the loader refuses a resource
  listed twice) may share disjoint devices of it (say device 0 as gpu-light, 1 as gpu-heavy); selecting
  one device twice is a ConfigError. A rename that lands on a name another resource uses is a
  ConfigError too (and one name with two replica counts is refused by the v1 types): NVIDIA silently
  merges them into one resource, which mixes GPU models or replica counts that the plan cannot
  describe. Pooling is what `resources.gpus` / `resources.mig` patterns are for.
* MPS replicas of MIG devices are refused (InventoryError), as NVIDIA refuses to start MPS for them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from nvidia_device_plugin.base.errors import ConfigError, InventoryError
from nvidia_device_plugin.config.sharing_modes import SharingModeFacts, sharing_mode
from nvidia_device_plugin.config.v1 import Config, ReplicatedResource, Sharing
from nvidia_device_plugin.devices import Gpu, Inventory
from nvidia_device_plugin.plans.mig_layout import MigLayoutViolation, mig_layout_violations
from nvidia_device_plugin.plans.resources import AdvertisedDevice, ResourcePlan, base_resources, replica_of

_GPU_INDEX_REF = re.compile(r"^\d+$")
_MIG_INDEX_REF = re.compile(r"^(\d+):(\d+)$")
_LISTED_IDS = 16  # how many device names an error message lists before "..."


def build_resources(
    inventory: Inventory, config: Config, mig_violations: Sequence[MigLayoutViolation] | None = None
) -> tuple[ResourcePlan, ...]:
    """Every resource this node advertises under `config`, sorted by name, devices in physical order.

    `mig_violations` are the GPUs mig_layout.py leaves out under `config.flags.mig_strategy`: the pipeline
    computes them once per snapshot and passes them here; without them (plan tables, tests) they are
    computed here.

    Raises InventoryError when the node cannot be advertised as configured (duplicate indexes or UUIDs,
    MPS on MIG) and ConfigError when the config does not resolve on this node (device refs, counts, names).
    """
    strategy = config.flags.mig_strategy
    gpus = sorted(inventory.gpus, key=lambda gpu: gpu.index)
    _check_identities(gpus)
    if mig_violations is None:
        mig_violations = mig_layout_violations(gpus, strategy)
    left_out = {v.gpu_index for v in mig_violations}
    gpus = [gpu for gpu in gpus if gpu.index not in left_out]
    base = base_resources(gpus, config.resources, strategy)
    plans = _apply_sharing(base, config.sharing, _legacy_mig_uuids(gpus))
    _check_sockets(plans)
    return plans


def _check_identities(gpus: Sequence[Gpu]) -> None:
    """Device IDs and `devices` refs rely on unique indexes and UUIDs; a broken inventory stops here."""
    by_index: dict[int, Gpu] = {}
    by_uuid: dict[str, tuple[tuple[int, int | None], str]] = {}  # UUID -> (where, label) first seen
    for gpu in gpus:
        other = by_index.setdefault(gpu.index, gpu)
        if other is not gpu:
            raise InventoryError(f"GPU index {gpu.index} is reported twice ({other.uuid} and {gpu.uuid})")
        mig_indexes = [mig.index for mig in gpu.mig_devices]
        if len(set(mig_indexes)) != len(mig_indexes):
            raise InventoryError(f"{gpu.label} reports a MIG device index twice: {sorted(mig_indexes)}")
        physical: list[tuple[str, tuple[int, int | None], str]] = [(gpu.uuid, (gpu.index, None), gpu.label)]
        physical += [
            (mig.uuid, (gpu.index, mig.index), f"{mig.label} on {gpu.label}") for mig in gpu.mig_devices
        ]
        for uuid, where, label in physical:
            seen_where, seen_label = by_uuid.setdefault(uuid, (where, label))
            if seen_where != where:
                raise InventoryError(f"UUID {uuid} is reported for both {seen_label} and {label}")


def _legacy_mig_uuids(gpus: Sequence[Gpu]) -> dict[str, str]:
    """Old-driver MIG names ("MIG-GPU-<uuid>/<gi>/<ci>", still accepted in `devices` lists) -> MIG UUID."""
    return {
        f"MIG-{gpu.uuid}/{mig.gpu_instance_id}/{mig.compute_instance_id}": mig.uuid
        for gpu in gpus
        for mig in gpu.mig_devices
    }


@dataclass
class _Target:
    """What one advertised name has collected so far while sharing is applied."""

    source: str  # the pre-sharing resource its devices come from
    origin: str  # who put them there, for messages
    replicas: int | None = None  # None while it holds only unshared devices
    replicas_origin: str = ""
    devices: list[AdvertisedDevice] = field(default_factory=list)


def _apply_sharing(
    base: dict[str, list[AdvertisedDevice]], sharing: Sharing, legacy_mig_uuids: dict[str, str]
) -> tuple[ResourcePlan, ...]:
    mode = sharing_mode(sharing.strategy)
    active = sharing.active
    section = mode.section
    entries = active.resources if mode.shares_devices else ()
    claimed: dict[str, dict[str, str]] = {}  # resource -> device ID -> the entry sharing it
    targets: dict[str, _Target] = {}
    for i, entry in enumerate(entries):
        path = f"{section}.resources[{i}]"
        devices = base.get(entry.name)
        if not devices:
            continue  # a resource other nodes of the cluster have
        selected = _select(entry, devices, path, base, legacy_mig_uuids)
        taken = claimed.setdefault(entry.name, {})
        for dev in selected:
            if dev.id in taken:
                raise ConfigError(
                    f"{path}.devices selects {dev.label}, which {taken[dev.id]} already shares; "
                    "a device can be shared by one entry only"
                )
            if not mode.shares_mig_devices and dev.kind == "mig":
                raise InventoryError(
                    f"{path} shares {dev.label} on {dev.gpu_label} with MPS, which is not supported for "
                    "MIG devices; "
                    "share MIG devices with timeSlicing instead"
                )
            if mode.replicas_at_most is not None and entry.replicas > mode.replicas_at_most:
                raise ConfigError(
                    f"{path}.replicas is {entry.replicas}, but {dev.label} accepts at most "
                    f"{mode.replicas_at_most} MPS clients (Volta and newer); lower the replicas"
                )
            taken[dev.id] = path
        name = active.advertised_name(entry)  # one replica count per name: the v1 types see to it
        target = _target(targets, name, source=entry.name, origin=path)
        if target.replicas is None:
            target.replicas, target.replicas_origin = entry.replicas, path
        target.devices.extend(replica_of(dev, n) for dev in selected for n in range(entry.replicas))
    for name, devices in base.items():
        taken = claimed.get(name, {})
        unshared = [dev for dev in devices if dev.id not in taken]
        if unshared:
            _target(targets, name, source=name, origin="its unshared devices").devices.extend(unshared)
    return tuple(
        _plan(name, targets[name], mode, active.fail_requests_greater_than_one) for name in sorted(targets)
    )


def _target(targets: dict[str, _Target], name: str, source: str, origin: str) -> _Target:
    target = targets.get(name)
    if target is None:
        target = targets[name] = _Target(source=source, origin=origin)
    elif target.source != source:
        raise ConfigError(
            f"{name} would hold devices of both {target.source} ({target.origin}) and {source} ({origin}); "
            "give the shared devices a name of their own, or pool devices with resources.gpus / resources.mig"
        )
    return target


def _select(
    entry: ReplicatedResource,
    devices: Sequence[AdvertisedDevice],
    path: str,
    base: dict[str, list[AdvertisedDevice]],
    legacy_mig_uuids: dict[str, str],
) -> list[AdvertisedDevice]:
    selection = entry.devices  # refs, else a count (>= 1), else all: the v1 type refuses anything else
    if selection.refs:
        return _resolve_refs(entry.name, selection.refs, devices, path, base, legacy_mig_uuids)
    if selection.count is None:
        return list(devices)
    if selection.count > len(devices):
        raise ConfigError(
            f"{path}.devices asks to share {selection.count} devices of {entry.name}, "
            f"but this node has {len(devices)}: {_list_devices(devices)}"
        )
    return list(devices[: selection.count])


class _RefIndex:
    """Finds a device by the ways a `devices` list may name it: "3", "3:1", GPU/MIG UUID, legacy MIG name."""

    def __init__(self, devices: Iterable[AdvertisedDevice], legacy_mig_uuids: dict[str, str]) -> None:
        self._by_index: dict[str, AdvertisedDevice] = {}
        self._by_uuid: dict[str, AdvertisedDevice] = {}
        for dev in devices:
            self._by_index.setdefault(dev.index_id, dev)
            self._by_uuid.setdefault(dev.physical_uuid, dev)
        self._legacy = legacy_mig_uuids

    def find(self, ref: str) -> AdvertisedDevice | None:
        mig = _MIG_INDEX_REF.match(ref)
        if mig:
            return self._by_index.get(f"{int(mig[1])}:{int(mig[2])}")
        if _GPU_INDEX_REF.match(ref):
            return self._by_index.get(str(int(ref)))
        return self._by_uuid.get(ref) or self._by_uuid.get(self._legacy.get(ref, ""))


def _resolve_refs(
    name: str,
    refs: Sequence[str],
    devices: Sequence[AdvertisedDevice],
    path: str,
    base: dict[str, list[AdvertisedDevice]],
    legacy_mig_uuids: dict[str, str],
) -> list[AdvertisedDevice]:
    index = _RefIndex(devices, legacy_mig_uuids)
    selected: dict[str, AdvertisedDevice] = {}
    for k, raw in enumerate(refs):
        ref = str(raw).strip()
        dev = index.find(ref)
        if dev is None:
            raise ConfigError(
                _unresolved_ref(f"{path}.devices[{k}]", ref, name, devices, base, legacy_mig_uuids)
            )
        selected.setdefault(dev.id, dev)
    return list(selected.values())


def _unresolved_ref(
    field_path: str,
    ref: str,
    name: str,
    devices: Sequence[AdvertisedDevice],
    base: dict[str, list[AdvertisedDevice]],
    legacy_mig_uuids: dict[str, str],
) -> str:
    for other, other_devices in sorted(base.items()):
        dev = _RefIndex(other_devices, legacy_mig_uuids).find(ref)
        if dev is not None and other != name:
            return f"{field_path} = {ref!r} is {dev.label}, which this node advertises as {other}, not {name}"
    gpu_ref = str(int(ref)) if _GPU_INDEX_REF.match(ref) else ref
    for dev in (dev for devs in base.values() for dev in devs):
        if dev.kind == "mig" and gpu_ref in (str(dev.gpu_index), dev.gpu_uuid):
            return (
                f"{field_path} = {ref!r} is {dev.gpu_label}, which is in MIG mode; "
                f"refer to its MIG devices as '{dev.gpu_index}:<n>' or by MIG UUID"
            )
    return f"{field_path} = {ref!r} matches no device on this node; {name} has {_list_devices(devices)}"


def _plan(
    name: str, target: _Target, mode: SharingModeFacts, fail_requests_greater_than_one: bool
) -> ResourcePlan:
    devices = tuple(sorted(target.devices, key=_physical_order))
    if target.replicas is None:
        return ResourcePlan(name=name, devices=devices)
    if not mode.shares_mig_devices:
        mig = next((dev for dev in devices if dev.kind == "mig"), None)
        if mig is not None:
            raise InventoryError(
                f"{target.replicas_origin} shares {name} with MPS, but {name} also holds "
                f"{mig.label}; MPS is not supported for MIG devices"
            )
    return ResourcePlan(
        name=name,
        devices=devices,
        sharing=mode.name,
        replicas=target.replicas,
        fail_requests_greater_than_one=fail_requests_greater_than_one,
    )


def _physical_order(dev: AdvertisedDevice) -> tuple[int, int, int]:
    return (
        dev.gpu_index,
        -1 if dev.mig_index is None else dev.mig_index,
        -1 if dev.replica is None else dev.replica,
    )


def _check_sockets(plans: Sequence[ResourcePlan]) -> None:
    owners: dict[str, str] = {}
    for plan in plans:
        owner = owners.setdefault(plan.socket_name, plan.name)
        if owner != plan.name:
            raise ConfigError(
                f"resources {owner} and {plan.name} would both be served on socket {plan.socket_name}; "
                "rename one of them"
            )


def _list_devices(devices: Sequence[AdvertisedDevice]) -> str:
    names = [f"{dev.index_id} ({dev.physical_uuid})" for dev in devices[:_LISTED_IDS]]
    return ", ".join(names) + (", ..." if len(devices) > _LISTED_IDS else "")

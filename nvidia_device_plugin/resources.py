"""Inventory + config -> the resources this node advertises and the device IDs inside each.

This module is the one place that builds and parses advertised device IDs (`<uuid>::<replica>`), and
`build_resources` is the one place that decides which resource each physical device is advertised under.
It follows NVIDIA's k8s-device-plugin (internal/rm/device_map.go, rm.go; api/config/v1):

* MIG strategy `none`: whole GPUs only; a GPU in MIG mode is still advertised as a whole GPU.
  `single`: MIG mode must be on for all GPUs or for none (none: same as `none`); every MIG device must
  have the same profile; MIG devices are advertised as `nvidia.com/gpu`. `mixed`: one resource per MIG
  profile, `nvidia.com/mig-<profile>`, and whole GPUs for the GPUs not in MIG mode. GPUs that break the
  strategy's rules are left out and the rest served (mig_layout.py says which, and why).
* Renames: `resources.gpus` patterns are matched against the GPU product name, `resources.mig` patterns
  against the MIG profile, first match wins. A pattern is a `*`-glob matched against the whole name
  (anchored, as NVIDIA's v0.20 `ResourcePattern.Matches`), so "*A100*" matches "NVIDIA A100-SXM4-80GB"
  and "A100" does not; "1g.10gb" does not match "1g.10gb+me". User patterns come first; NVIDIA's
  defaults (`*` -> gpu; under `single` also MIG `*` -> gpu; under `mixed` each profile -> mig-<profile>,
  "+" written as ".") catch the rest.
* Sharing: each entry of the active `sharing.timeSlicing` / `sharing.mps` list turns the selected
  devices of the named resource into `replicas` IDs each (`<uuid>::<n>`), under `rename`, or
  `<name>.shared` with renameByDefault, or else the same name. Devices the entries do not select stay
  advertised, unshared, under their resource's name (so one resource can hold both).

NVIDIA's released plugin drops `resources` at start-up (DisableResourceNamingInConfig; older releases
also dropped per-entry renames and device lists); here they take effect, as its resource manager
would apply them.

Choices where NVIDIA is silent, buggy or random, made to be predictable:

* A `devices` selection uses its refs if any, else its count, else `all`.
* "The first `count` devices" are the first in GPU index (then MIG index) order; NVIDIA takes them
  in Go map order, which is random.
* A sharing entry naming a resource this node does not have is skipped, as NVIDIA does: one ConfigMap
  often serves a heterogeneous cluster (an `nvidia.com/a100` entry on a T4 node). But a `devices` ref
  (index, "g:m", UUID) that does not resolve within a resource the node does have is a ConfigError, as
  in NVIDIA, with a message that says where the device is advertised instead, if anywhere. Per-node
  device lists belong in per-node configs (NVIDIA's `nvidia.com/device-plugin.config` node label).
* Two entries may share disjoint devices of one resource (say device 0 as gpu-light, 1 as gpu-heavy);
  selecting one device twice is a ConfigError. A rename that lands on a name another resource uses,
  or one name receiving replicas of two different replica counts, is a ConfigError too: NVIDIA silently
  merges them into one resource, which mixes GPU models or replica counts that the plan cannot
  describe. Pooling is what `resources.gpus` / `resources.mig` patterns are for.
* Default MIG resources are one per profile present, as NVIDIA v0.20's anchored default patterns give:
  "1g.10gb+me" gets its own `mig-1g.10gb.me`, "1g.10gb-me" `mig-1g.10gb-me`. A compute-instance profile
  such as "1c.3g.40gb" goes to `mig-3g.40gb`, with its GPU instance.
* MPS replicas of MIG devices are refused (InventoryError), as NVIDIA refuses to start MPS for them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import Literal

from nvidia_device_plugin.config.v1 import (
    RESOURCE_PREFIX,
    SHARED_SUFFIX,
    Config,
    MigStrategy,
    ReplicatedDevices,
    ReplicatedResource,
    ResourcePattern,
    Resources,
    Sharing,
    SharingMode,
)
from nvidia_device_plugin.devices import Gpu, Inventory, MigDevice
from nvidia_device_plugin.errors import ConfigError, InventoryError
from nvidia_device_plugin.mig_layout import mig_layout_violations
from nvidia_device_plugin.resource_names import default_mig_resource_name, resource_pattern_matches

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

    @property
    def label(self) -> str:
        """How messages name the device behind this ID: "GPU 3 (GPU-...)", "MIG device 3:1 (MIG-...)"."""
        if self.mig_index is None:
            return f"GPU {self.gpu_index} ({self.gpu_uuid})"
        return f"MIG device {self.index_id} ({self.physical_uuid})"


@dataclass(frozen=True)
class ResourcePlan:
    """One advertised resource (one gRPC server, one kubelet registration)."""

    name: str  # fully qualified, e.g. "nvidia.com/gpu" or "nvidia.com/mig-1g.10gb"
    devices: tuple[AdvertisedDevice, ...]
    sharing: SharingMode = "none"
    replicas: int = 1  # replicas per physical device when shared
    fail_requests_greater_than_one: bool = False

    @cached_property
    def devices_per_physical(self) -> Mapping[str, int]:
        """How many advertised IDs each physical device (GPU or MIG UUID) has here: its replicas, or 1.

        Computed once per plan (a plan is never changed), not on every GetPreferredAllocation call.
        """
        return MappingProxyType(dict(Counter(d.physical_uuid for d in self.devices)))

    @property
    def socket_name(self) -> str:
        """Socket file name in the device-plugin directory, as NVIDIA's plugin names it (nvidia-gpu.sock)."""
        prefix, _, short = self.name.rpartition("/")
        base = short if prefix == "nvidia.com" else self.name.replace("/", "-")
        return f"nvidia-{base}.sock"


DEFAULT_GPU_RESOURCE = f"{RESOURCE_PREFIX}/gpu"
# An MPS server takes at most 48 client processes per GPU (Volta and newer), so more replicas would
# advertise devices whose pods cannot connect.
MPS_MAX_CLIENTS_PER_GPU = 48


_GPU_INDEX_REF = re.compile(r"^\d+$")
_MIG_INDEX_REF = re.compile(r"^(\d+):(\d+)$")
_LISTED_IDS = 16  # how many device names an error message lists before "..."


def build_resources(inventory: Inventory, config: Config) -> tuple[ResourcePlan, ...]:
    """Every resource this node advertises under `config`, sorted by name, devices in physical order.

    Raises InventoryError when the node cannot be advertised as configured (MIG layout vs strategy, MPS
    on MIG) and ConfigError when the config does not resolve on this node (device refs, counts, names).
    """
    strategy = config.flags.mig_strategy  # validated by the config loader
    gpus = sorted(inventory.gpus, key=lambda gpu: gpu.index)
    _check_identities(gpus)
    left_out = {v.gpu_index for v in mig_layout_violations(gpus, strategy)}
    gpus = [gpu for gpu in gpus if gpu.index not in left_out]
    base = _base_resources(gpus, config.resources, strategy)
    plans = _apply_sharing(base, config.sharing, _legacy_mig_uuids(gpus))
    _check_sockets(plans)
    return plans


# --- the node's devices under their (renamed) resource names, before sharing -------------------------


def _check_identities(gpus: Sequence[Gpu]) -> None:
    """Device IDs and `devices` refs rely on unique indexes and UUIDs; a broken inventory stops here."""
    by_index: dict[int, Gpu] = {}
    by_uuid: dict[str, str] = {}
    for gpu in gpus:
        other = by_index.setdefault(gpu.index, gpu)
        if other is not gpu:
            raise InventoryError(f"GPU index {gpu.index} is reported twice ({other.uuid} and {gpu.uuid})")
        physical = [(gpu.uuid, _gpu_desc(gpu))]
        physical += [(mig.uuid, _mig_desc(gpu, mig)) for mig in gpu.mig_devices]
        mig_indexes = [mig.index for mig in gpu.mig_devices]
        if len(set(mig_indexes)) != len(mig_indexes):
            raise InventoryError(f"{_gpu_desc(gpu)} reports a MIG device index twice: {sorted(mig_indexes)}")
        for uuid, desc in physical:
            seen = by_uuid.setdefault(uuid, desc)
            if seen != desc:
                raise InventoryError(f"UUID {uuid} is reported for both {seen} and {desc}")


def _base_resources(
    gpus: Sequence[Gpu], resources: Resources, strategy: MigStrategy
) -> dict[str, list[AdvertisedDevice]]:
    base: dict[str, list[AdvertisedDevice]] = {}
    for gpu in gpus:
        if gpu.mig_enabled and strategy != "none":
            for mig in sorted(gpu.mig_devices, key=lambda mig: mig.index):
                name = _mig_resource_name(mig.profile, resources.mig, strategy)
                base.setdefault(name, []).append(mig_device(gpu, mig))
        else:
            name = _first_match(resources.gpus, gpu.name) or DEFAULT_GPU_RESOURCE
            base.setdefault(name, []).append(whole_gpu_device(gpu))
    return base


def _mig_resource_name(profile: str, patterns: Sequence[ResourcePattern], strategy: MigStrategy) -> str:
    named = _first_match(patterns, profile)
    if named is not None:
        return named
    return DEFAULT_GPU_RESOURCE if strategy == "single" else default_mig_resource_name(profile)


def _first_match(patterns: Sequence[ResourcePattern], name: str) -> str | None:
    for pattern in patterns:
        if resource_pattern_matches(pattern.pattern, name):
            return pattern.name
    return None


def whole_gpu_device(gpu: Gpu) -> AdvertisedDevice:
    """The unshared advertised device for a whole GPU."""
    return AdvertisedDevice(
        id=gpu.uuid,
        kind="gpu",
        physical_uuid=gpu.uuid,
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        mig_index=None,
        replica=None,
        numa_node=gpu.numa_node,
        memory_bytes=gpu.memory_bytes,
    )


def mig_device(gpu: Gpu, mig: MigDevice) -> AdvertisedDevice:
    """The unshared advertised device for a MIG device of `gpu`."""
    return AdvertisedDevice(
        id=mig.uuid,
        kind="mig",
        physical_uuid=mig.uuid,
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        mig_index=mig.index,
        replica=None,
        numa_node=gpu.numa_node,
        memory_bytes=mig.memory_bytes,
    )


def _legacy_mig_uuids(gpus: Sequence[Gpu]) -> dict[str, str]:
    """Old-driver MIG names ("MIG-GPU-<uuid>/<gi>/<ci>", still accepted in `devices` lists) -> MIG UUID."""
    return {
        f"MIG-{gpu.uuid}/{mig.gpu_instance_id}/{mig.compute_instance_id}": mig.uuid
        for gpu in gpus
        for mig in gpu.mig_devices
    }


# --- sharing: replicas, renames, and what stays unshared ----------------------------------------------


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
    mode = sharing.strategy
    active = sharing.active
    section = "sharing.mps" if mode == "mps" else "sharing.timeSlicing"
    entries = active.resources if mode != "none" else ()
    claimed: dict[str, dict[str, str]] = {}  # resource -> device ID -> the entry sharing it
    targets: dict[str, _Target] = {}
    for i, entry in enumerate(entries):
        path = f"{section}.resources[{i}]"
        if entry.replicas < 1:
            raise ConfigError(f"{path}.replicas must be >= 1, got {entry.replicas}")
        devices = base.get(entry.name)
        if not devices:
            continue  # a resource other nodes of the cluster have
        selected = _select(entry, devices, path, base, legacy_mig_uuids)
        taken = claimed.setdefault(entry.name, {})
        for dev in selected:
            if dev.id in taken:
                raise ConfigError(
                    f"{path}.devices selects {_device_desc(dev)}, which {taken[dev.id]} already shares; "
                    "a device can be shared by one entry only"
                )
            if mode == "mps" and dev.kind == "mig":
                raise InventoryError(
                    f"{path} shares {_device_desc(dev)} with MPS, which is not supported for MIG devices; "
                    "share MIG devices with timeSlicing instead"
                )
            if mode == "mps" and entry.replicas > MPS_MAX_CLIENTS_PER_GPU:
                raise ConfigError(
                    f"{path}.replicas is {entry.replicas}, but {_device_desc(dev)} accepts at most "
                    f"{MPS_MAX_CLIENTS_PER_GPU} MPS clients (Volta and newer); lower the replicas"
                )
            taken[dev.id] = path
        name = _shared_name(entry, active.rename_by_default)
        target = _target(targets, name, source=entry.name, origin=path)
        if target.replicas is not None and target.replicas != entry.replicas:
            raise ConfigError(
                f"{path} shares devices as {name} with replicas={entry.replicas}, but "
                f"{target.replicas_origin} already does with replicas={target.replicas}; "
                "use one count or give one entry a rename"
            )
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


def _shared_name(entry: ReplicatedResource, rename_by_default: bool) -> str:
    if entry.rename:
        return entry.rename
    return entry.name + SHARED_SUFFIX if rename_by_default else entry.name


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
    selection: ReplicatedDevices = entry.devices
    if selection.refs:
        return _resolve_refs(entry.name, selection.refs, devices, path, base, legacy_mig_uuids)
    if selection.count is not None:
        if selection.count < 1:
            raise ConfigError(f"{path}.devices count must be >= 1, got {selection.count}")
        if selection.count > len(devices):
            raise ConfigError(
                f"{path}.devices asks to share {selection.count} devices of {entry.name}, "
                f"but this node has {len(devices)}: {_list_devices(devices)}"
            )
        return list(devices[: selection.count])
    if selection.all:
        return list(devices)
    raise ConfigError(f"{path}.devices selects no devices; use 'all', a count or a list of devices")


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
            return (
                f"{field_path} = {ref!r} is {_device_desc(dev)}, "
                f"which this node advertises as {other}, not {name}"
            )
    gpu_ref = str(int(ref)) if _GPU_INDEX_REF.match(ref) else ref
    for dev in (dev for devs in base.values() for dev in devs):
        if dev.kind == "mig" and gpu_ref in (str(dev.gpu_index), dev.gpu_uuid):
            return (
                f"{field_path} = {ref!r} is GPU {dev.gpu_index} ({dev.gpu_uuid}), which is in MIG mode; "
                f"refer to its MIG devices as '{dev.gpu_index}:<n>' or by MIG UUID"
            )
    return f"{field_path} = {ref!r} matches no device on this node; {name} has {_list_devices(devices)}"


def replica_of(dev: AdvertisedDevice, replica: int) -> AdvertisedDevice:
    """Replica `replica` of an unshared advertised device."""
    return replace(dev, id=replica_id(dev.physical_uuid, replica), replica=replica)


def _plan(
    name: str, target: _Target, mode: SharingMode, fail_requests_greater_than_one: bool
) -> ResourcePlan:
    devices = tuple(sorted(target.devices, key=_physical_order))
    if target.replicas is None:
        return ResourcePlan(name=name, devices=devices)
    if mode == "mps":
        mig = next((dev for dev in devices if dev.kind == "mig"), None)
        if mig is not None:
            raise InventoryError(
                f"{target.replicas_origin} shares {name} with MPS, but {name} also holds "
                f"{_device_desc(mig)}; MPS is not supported for MIG devices"
            )
    return ResourcePlan(
        name=name,
        devices=devices,
        sharing=mode,
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


# --- names in messages ---------------------------------------------------------------------------------


def _gpu_desc(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.uuid})"


def _mig_desc(gpu: Gpu, mig: MigDevice) -> str:
    return f"MIG device {gpu.index}:{mig.index} ({mig.uuid}, {mig.profile}) on GPU {gpu.index} ({gpu.uuid})"


def _device_desc(dev: AdvertisedDevice) -> str:
    if dev.mig_index is None:
        return f"GPU {dev.gpu_index} ({dev.gpu_uuid})"
    return f"MIG device {dev.index_id} ({dev.physical_uuid}) on GPU {dev.gpu_index} ({dev.gpu_uuid})"


def _list_devices(devices: Sequence[AdvertisedDevice]) -> str:
    names = [f"{dev.index_id} ({dev.physical_uuid})" for dev in devices[:_LISTED_IDS]]
    return ", ".join(names) + (", ..." if len(devices) > _LISTED_IDS else "")

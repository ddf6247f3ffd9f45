"""The one pipeline: an NVML session and a config -> the inventory -> the resource plans served.

Everything that needs "what would this node advertise" calls `build_snapshot`: the daemon at start and on
every reload, `plan`, `demo`, the benchmarks and the tests. A Snapshot is replaced whole, never mutated, so
a reader (a gRPC call, a scrape) always sees one consistent moment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.cdi.model import CdiPlan
from nvidia_device_plugin.cdi.spec import plan_cdi
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.devices import DiscoveryProblem, Inventory
from nvidia_device_plugin.errors import ConfigError
from nvidia_device_plugin.mig_layout import MigLayoutViolation, mig_layout_violations
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.session import NvmlSession
from nvidia_device_plugin.resource_plans import build_resources
from nvidia_device_plugin.resources import ResourcePlan
from nvidia_device_plugin.serving.allocate import AllocationSettings


@dataclass(frozen=True)
class Snapshot:
    """What is served right now: the config, what discovery found, and the plans built from both."""

    config: Config
    inventory: Inventory
    plans: tuple[ResourcePlan, ...]
    allocation: AllocationSettings
    mig_violations: tuple[MigLayoutViolation, ...] = ()  # GPUs left out for breaking flags.migStrategy
    cdi: CdiPlan | None = None  # the CDI specs a CDI device-list strategy needs; None without one


def build_snapshot(session: NvmlSession, config: Config, previous: Inventory | None = None) -> Snapshot:
    """Discover the node through `session` and expand it under `config`.

    `previous` is the inventory served until now (on a reload): a GPU it had that NVML can no longer even
    open (GPU_IS_LOST from nvmlDeviceGetHandleByIndex, so not even its UUID can be read) is carried over
    as lost, so that it stays advertised as Unhealthy instead of vanishing from kubelet's list.

    Raises NvmlError when discovery fails and ConfigError / InventoryError when the config cannot be
    applied to what was found.
    """
    inventory = discover(session.nv, session.host.sysfs_root, session.host.proc_root)
    if previous is not None:
        inventory = carry_over_lost(inventory, previous)
    violations = mig_layout_violations(inventory.gpus, config.flags.mig_strategy)
    plans = build_resources(inventory, config, violations)
    check_device_list_sizes(plans)
    allocation = AllocationSettings.from_config(config, session.host)
    cdi = plan_cdi(inventory, plans, config, session.host)
    return Snapshot(config, inventory, plans, allocation, violations, cdi)


def carry_over_lost(inventory: Inventory, previous: Inventory) -> Inventory:
    """`inventory` plus, marked lost, the GPUs of `previous` that discovery could not read this time."""
    indices = {gpu.index for gpu in inventory.gpus}
    failed = {p.gpu_index for p in inventory.problems if p.gpu_index is not None}
    missing = [
        replace(gpu, lost=True)
        for gpu in previous.gpus
        if gpu.index not in indices and gpu.index in failed and inventory.gpu(gpu.uuid) is None
    ]
    if not missing:
        return inventory
    kept = {gpu.index for gpu in missing}
    links = [*inventory.links, *(ln for ln in previous.links if ln.a in kept or ln.b in kept)]
    problems = [p for p in inventory.problems if p.gpu_index not in kept]
    problems += [
        DiscoveryProblem(
            gpu.index,
            next(p.call for p in inventory.problems if p.gpu_index == gpu.index),
            next(p.code for p in inventory.problems if p.gpu_index == gpu.index),
            f"{gpu.label} can no longer be read; still advertised, as Unhealthy "
            "(lost), with what was known of it before",
        )
        for gpu in missing
    ]
    return replace(
        inventory,
        gpus=tuple(sorted([*inventory.gpus, *missing], key=lambda gpu: gpu.index)),
        links=tuple(sorted(links, key=lambda ln: (ln.a, ln.b))),
        problems=tuple(problems),
    )


# Kubelet dials plugins without raising grpc-go's default receive limit: a ListAndWatch message over it
# is dropped by kubelet, and the resource silently falls to 0 devices on the node.
KUBELET_RECEIVE_LIMIT = 4 * 1024 * 1024
# What check-config assumes about a node it cannot see: the largest GPU count of current servers (HGX and
# DGX boards carry 8; some PCIe servers 16), and 7 MIG devices per GPU for a MIG resource.
CHECK_CONFIG_MAX_GPUS = 16
CHECK_CONFIG_MAX_MIG_PER_GPU = 7
# One advertised replica at its largest on the wire: a MIG UUID replica ID, "Unhealthy", a NUMA node.
_WORST_DEVICE = pb.Device(ID="MIG-" + "0" * 36 + "::4095", health="Unhealthy")
_WORST_DEVICE.topology.nodes.add(ID=7)
# Bytes one device adds to a ListAndWatchResponse at most (the field tag and length included).
_DEVICE_ENTRY_BYTES = pb.ListAndWatchResponse(devices=[_WORST_DEVICE]).ByteSize()


def check_device_list_sizes(plans: Sequence[ResourcePlan]) -> None:
    """Refuse plans whose ListAndWatch message kubelet would drop (over its 4 MiB receive limit)."""
    for plan in plans:
        worst = len(plan.devices) * _DEVICE_ENTRY_BYTES
        if worst <= KUBELET_RECEIVE_LIMIT:
            continue
        size = pb.ListAndWatchResponse(
            devices=[_wire_device(d.id, d.numa_node) for d in plan.devices]
        ).ByteSize()
        if size > KUBELET_RECEIVE_LIMIT:
            raise ConfigError(
                f"{plan.name} would advertise {len(plan.devices)} devices in a ListAndWatch message of "
                f"{size:,} bytes, over kubelet's {KUBELET_RECEIVE_LIMIT:,}-byte gRPC receive limit (kubelet "
                "would drop the list and see 0 devices); lower the replicas or share fewer devices"
            )


def check_config_device_lists(config: Config) -> None:
    """check-config's version of check_device_list_sizes, for a node it cannot see (the largest one likely).

    A shared resource advertises replicas x devices; the devices are assumed to be
    CHECK_CONFIG_MAX_GPUS GPUs, or 7 MIG devices on each of them for a MIG resource.
    """
    sharing = config.sharing
    entries = [*sharing.time_slicing.resources, *(sharing.mps.resources if sharing.mps else ())]
    for i, entry in enumerate(entries):
        devices = CHECK_CONFIG_MAX_GPUS * (CHECK_CONFIG_MAX_MIG_PER_GPU if "/mig-" in entry.name else 1)
        if entry.devices.count is not None:
            devices = min(devices, entry.devices.count)
        elif entry.devices.refs:
            devices = min(devices, len(entry.devices.refs))
        size = devices * entry.replicas * _DEVICE_ENTRY_BYTES
        if size > KUBELET_RECEIVE_LIMIT:
            section = "timeSlicing" if i < len(sharing.time_slicing.resources) else "mps"
            raise ConfigError(
                f"sharing.{section} resource {entry.name} with replicas: {entry.replicas} would advertise "
                f"up to {devices * entry.replicas:,} devices ({size:,} bytes in one ListAndWatch message) on "
                f"a node with {CHECK_CONFIG_MAX_GPUS} GPUs, over kubelet's {KUBELET_RECEIVE_LIMIT:,}-byte "
                "gRPC receive limit; lower the replicas"
            )


def _wire_device(device_id: str, numa_node: int | None) -> pb.Device:
    device = pb.Device(ID=device_id, health="Unhealthy")
    if numa_node is not None:
        device.topology.nodes.add(ID=numa_node)
    return device

"""The one pipeline: an NVML session and a config -> the inventory -> the resource plans served.

Everything that needs "what would this node advertise" calls `build_snapshot`: the daemon at start and on
every reload, `plan`, `demo`, the benchmarks and the tests. A Snapshot is replaced whole, never mutated, so
a reader (a gRPC call, a scrape) always sees one consistent moment. A pure pipeline: nothing here runs,
waits or watches; both daemons move from one snapshot to the next through daemons/follower.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from nvidia_device_plugin.cdi.model import CdiPlan
from nvidia_device_plugin.config.v1 import Config, any_cdi_enabled
from nvidia_device_plugin.devices import DiscoveryProblem, Inventory
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.host import HostPaths
from nvidia_device_plugin.nvml.session import NvmlSession
from nvidia_device_plugin.plans.device_lists import check_device_list_sizes
from nvidia_device_plugin.plans.mig_layout import MigLayoutViolation, mig_layout_violations
from nvidia_device_plugin.plans.resource_plans import build_resources
from nvidia_device_plugin.plans.resources import ResourcePlan
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
    return snapshot_of(session, config, inventory)


def snapshot_of(session: NvmlSession, config: Config, inventory: Inventory) -> Snapshot:
    """`inventory`, as read already (no discovery), expanded under `config`; raises as build_snapshot."""
    violations = mig_layout_violations(inventory.gpus, config.flags.mig_strategy)
    plans = build_resources(inventory, config, violations)
    check_device_list_sizes(plans)
    cdi = _plan_cdi(inventory, plans, config, session.host)
    allocation = AllocationSettings.from_config(config, session.host, cdi)  # names what the CDI specs define
    return Snapshot(config, inventory, plans, allocation, violations, cdi)


def _plan_cdi(
    inventory: Inventory, plans: Sequence[ResourcePlan], config: Config, host: HostPaths
) -> CdiPlan | None:
    """cdi.spec.plan_cdi, whose node scan (and its modules) loads only under a CDI strategy: most nodes run
    without one, and importing it costs every start-up."""
    if not any_cdi_enabled(config.flags.plugin.device_list_strategy):
        return None
    from nvidia_device_plugin.cdi.spec import plan_cdi

    return plan_cdi(inventory, plans, config, host)


def carry_over_lost(inventory: Inventory, previous: Inventory) -> Inventory:
    """`inventory` with, marked lost and as `previous` knew them, the GPUs discovery could not read this
    time: those it could not even open (added), and those lost midway (GPU_IS_LOST, or a call stuck in
    the driver) that `previous` had read whole (their earlier facts kept: memory, PCI, MIG devices, links)."""
    inventory = _keep_earlier_facts(inventory, previous)
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


def _keep_earlier_facts(inventory: Inventory, previous: Inventory) -> Inventory:
    before = {gpu.uuid: gpu for gpu in previous.gpus if not gpu.lost}
    kept = {gpu.index: before[gpu.uuid] for gpu in inventory.gpus if gpu.lost and gpu.uuid in before}
    if not kept:
        return inventory
    gpus = tuple(replace(kept[g.index], lost=True) if g.index in kept else g for g in inventory.gpus)
    ours = {(ln.a, ln.b): ln for ln in previous.links if ln.a in kept or ln.b in kept}
    links = tuple(ours.get((ln.a, ln.b), ln) for ln in inventory.links)
    return replace(inventory, gpus=gpus, links=links)

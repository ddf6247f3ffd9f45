"""What the daemon tells the operator about the snapshot it serves; `plan` prints the same (one place).

At start and at every reload `run` logs:

- `config_line`: the config file chosen and why (`--config-file`, `--config-name`/`--config-default` in a
  ConfigMap directory, a fallback strategy, the node's label, or none), and every setting in force as one
  line of JSON: NVIDIA's `Running with config: {...}`;
- `resources_line`: each resource served with its device count and what makes it up, or why none is;
- `notices`: every warning about the snapshot: the config's (unknown keys, spelling, what NVIDIA v0.20
  ignores and so do we), the GPUs the MIG strategy leaves out, what discovery could not read, sharing
  entries that match no device of the node, `deviceDiscoveryStrategy: tegra`;
- with `--log-level debug`, `decisions`: what discovery found on each GPU and where it went, and what each
  sharing entry took.

`plan` prints the notices and, when nothing is advertised, `nothing_served_reason`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from nvidia_device_plugin.config.render import config_json
from nvidia_device_plugin.config.sharing_modes import sharing_mode
from nvidia_device_plugin.config.v1 import Config, ReplicatedResources
from nvidia_device_plugin.devices import Gpu, Inventory
from nvidia_device_plugin.plans.mig_layout import MigLayoutViolation
from nvidia_device_plugin.plans.resources import ResourcePlan, base_resources
from nvidia_device_plugin.snapshot import Snapshot

_GIB = 1024**3


@dataclass(frozen=True)
class Notice:
    """One warning about a snapshot. `key` names what it is about, so that a daemon logs it once while it
    stays the same (logs.FailureLog), and again when it changes."""

    key: str
    message: str
    level: int = logging.WARNING


def config_line(config: Config) -> str:
    """Which config is in force and why, with every setting, in one line (NVIDIA's "Running with config")."""
    origin = config.origin
    why = origin.why if origin is not None else "a config built in code"
    return f"config: {why}; running with config: {config_json(config)}"


def resources_line(snapshot: Snapshot) -> str:
    """ "resources: nvidia.com/gpu: 32 devices (8 GPUs x 4 replicas, time-slicing); ..." or why none."""
    if not snapshot.plans:
        return f"resources: none advertised: {nothing_served_reason(snapshot)}"
    return "resources: " + "; ".join(f"{plan.name}: {_plan_summary(plan)}" for plan in snapshot.plans)


def _plan_summary(plan: ResourcePlan) -> str:
    physical = {dev.physical_uuid: dev.kind for dev in plan.devices}
    migs = sum(1 for kind in physical.values() if kind == "mig")
    parts = [
        f"{n} {what}{'' if n == 1 else 's'}"
        for n, what in ((len(physical) - migs, "GPU"), (migs, "MIG device"))
        if n
    ]
    made_of = " + ".join(parts)
    if sharing_mode(plan.sharing).shares_devices:
        made_of += f" x {plan.replicas} replicas, {plan.sharing}"
    count = len(plan.devices)
    return f"{count} device{'' if count == 1 else 's'} ({made_of})"


def nothing_served_reason(snapshot: Snapshot) -> str:
    """Why `snapshot` advertises no resource (meaningful when it has no plans)."""
    gpus = snapshot.inventory.gpus
    if not gpus:
        return "NVML reports no GPUs on this node"
    left_out = {v.gpu_index for v in snapshot.mig_violations}
    if left_out >= {gpu.index for gpu in gpus}:
        strategy = snapshot.config.flags.mig_strategy
        return (
            f"every GPU breaks flags.migStrategy={strategy} (each is named in a warning); fix the MIG "
            "layout, or use migStrategy: mixed, which advertises each profile as its own resource"
        )
    return "no GPU is advertised under this config"


def notices(snapshot: Snapshot) -> list[Notice]:
    """Every warning about `snapshot`, in the order an operator reads them: config, node, plans."""
    config = snapshot.config
    found = [Notice(f"config {w.kind} {w.path}", f"config: {w.message}") for w in config.warnings]
    if config.flags.device_discovery_strategy == "tegra":
        found.append(
            Notice(
                "tegra", "deviceDiscoveryStrategy tegra is not supported: devices are discovered through NVML"
            )
        )
    found += [
        Notice(f"problem {p.gpu_index} {p.kind}", f"discovery: {p.message}")
        for p in snapshot.inventory.problems
    ]
    found += [Notice(f"mig {v.gpu_uuid} {v.strategy}", v.message) for v in snapshot.mig_violations]
    found += _unmatched_sharing(config, snapshot.inventory, snapshot.mig_violations)
    return found


def _unmatched_sharing(
    config: Config, inventory: Inventory, violations: Sequence[MigLayoutViolation]
) -> list[Notice]:
    """The active sharing entries naming a resource no device of this node is advertised under."""
    sharing = config.sharing
    mode = sharing_mode(sharing.strategy)
    if not mode.shares_devices:
        return []
    left_out = {v.gpu_index for v in violations}
    gpus = [gpu for gpu in inventory.gpus if gpu.index not in left_out]
    names = sorted(base_resources(gpus, config.resources, config.flags.mig_strategy))
    section = mode.section
    found = []
    for i, entry in enumerate(sharing.active.resources):
        if entry.name not in names:
            found.append(
                Notice(
                    f"unmatched {section} {entry.name}",
                    f"config: {section}.resources[{i}] shares {entry.name}, which no device of this node "
                    f"is advertised as (this node has {', '.join(names) or 'no resources'}); the entry is "
                    "skipped",
                )
            )
    return found


def decisions(snapshot: Snapshot) -> list[str]:
    """Debug lines: what discovery found on each GPU and where it went, what each sharing entry took."""
    advertised: dict[str, set[str]] = {}
    for plan in snapshot.plans:
        for dev in plan.devices:
            advertised.setdefault(dev.gpu_uuid, set()).add(plan.name)
    left_out = {v.gpu_uuid: v.strategy for v in snapshot.mig_violations}
    lines = []
    for gpu in sorted(snapshot.inventory.gpus, key=lambda g: g.index):
        if gpu.uuid in left_out:
            where = f"left out by flags.migStrategy={left_out[gpu.uuid]} (the warning says why)"
        elif gpu.uuid in advertised:
            where = "advertised as " + ", ".join(sorted(advertised[gpu.uuid]))
        else:
            where = "not advertised"
        lines.append(f"discovery: {_gpu_facts(gpu)}: {where}")
    lines += _sharing_decisions(snapshot.config, snapshot.plans)
    return lines


def _gpu_facts(gpu: Gpu) -> str:
    numa = "unknown" if gpu.numa_node is None else str(gpu.numa_node)
    mig = "off"
    if gpu.mig_enabled:
        profiles = ", ".join(m.profile for m in sorted(gpu.mig_devices, key=lambda m: m.index))
        mig = f"on ({profiles or 'no MIG devices'})"
    lost = ", lost" if gpu.lost else ""
    memory = f"{gpu.memory_bytes / _GIB:.1f} GiB"
    return f"{gpu.label} {gpu.name}, {memory}, PCI {gpu.pci_bus_id}, NUMA {numa}, MIG {mig}{lost}"


def _sharing_decisions(config: Config, plans: Sequence[ResourcePlan]) -> list[str]:
    sharing = config.sharing
    mode = sharing_mode(sharing.strategy)
    if not mode.shares_devices:
        return []
    active: ReplicatedResources = sharing.active
    section = mode.section
    by_name = {plan.name: plan for plan in plans}
    lines = []
    for i, entry in enumerate(active.resources):
        plan = by_name.get(active.advertised_name(entry))
        shared = (
            {d.physical_uuid for d in plan.devices if d.replica is not None} if plan is not None else set()
        )
        lines.append(
            f"sharing: {section}.resources[{i}] ({entry.name}, {entry.replicas} replicas) shares "
            f"{len(shared)} device{'' if len(shared) == 1 else 's'} as {active.advertised_name(entry)}"
        )
    return lines

"""GetPreferredAllocation: which of the available devices kubelet should give a container.

kubelet passes the devices it could give (`available`), the ones it must give (`must_include`) and how
many (`size`). The answer is always exactly `size` IDs, all from `available`, including `must_include`,
and the same for the same inputs whatever their order. The policy depends on what the resource holds:

* whole GPUs: the best-connected set (NVLink, then PCIe closeness, then NUMA nodes, then indices), found
  exactly by branch-and-bound (serving/preferred_gpus.py, with worked examples);
* MPS replicas, more than one: one GPU where one fits (sharing/mps.py, single_gpu_preference), else as
  replicas;
* replicas (time-slicing, MPS): NVIDIA's sharedDevicesAllocationPolicy (`distributed` or `packed`),
  topology-aware where NVIDIA leaves the order to chance (serving/preferred_groups.py);
* MIG devices: one GPU per request where possible, best fit (serving/preferred_groups.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from nvidia_device_plugin.base.errors import AllocationError
from nvidia_device_plugin.config.sharing_modes import sharing_mode
from nvidia_device_plugin.config.v1 import SharedAllocationPolicy
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.plans.resources import ResourcePlan
from nvidia_device_plugin.serving.preferred_gpus import best_connected
from nvidia_device_plugin.serving.preferred_groups import pack_mig, replicas_by_policy
from nvidia_device_plugin.sharing.mps import single_gpu_preference


def preferred_allocation(
    plan: ResourcePlan,
    inventory: Inventory,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    policy: SharedAllocationPolicy = "distributed",
) -> list[str]:
    """The `size` device IDs of `plan` to allocate, chosen from `available` by the policy above.

    `policy` is `flags.plugin.sharedDevicesAllocationPolicy`; it matters only for replicas. The IDs come
    back in the plan's order.
    """
    position = {d.id: n for n, d in enumerate(plan.devices)}
    available = list(dict.fromkeys(available))
    must_include = list(dict.fromkeys(must_include))
    _check_request(plan, position, available, must_include, size)
    if sharing_mode(plan.sharing).one_gpu_per_request and size > 1:
        # A container's MPS replicas must share one GPU (one pipe per resource): keep them together.
        together = single_gpu_preference(plan, available, must_include, size)
        if together is not None:
            return sorted(together, key=position.__getitem__)
    devices = [plan.devices[n] for n in sorted(position[i] for i in available)]
    required = [plan.devices[n] for n in sorted(position[i] for i in must_include)]
    if any(d.replica is not None for d in devices):
        chosen = replicas_by_policy(plan, inventory, devices, required, size, policy)
    elif any(d.kind == "mig" for d in devices):
        chosen = pack_mig(devices, required, size)
    else:
        chosen = best_connected(inventory, devices, required, size)
    return [d.id for d in sorted(chosen, key=lambda d: position[d.id])]


def _check_request(
    plan: ResourcePlan, position: dict[str, int], available: list[str], must_include: list[str], size: int
) -> None:
    if size < 1:
        raise AllocationError(f"allocation_size must be >= 1, got {size}")
    for field_name, ids in (("available_deviceIDs", available), ("must_include_deviceIDs", must_include)):
        for device_id in ids:
            if device_id not in position:
                raise AllocationError(
                    f"{field_name}: unknown device ID '{device_id}' for resource {plan.name}"
                )
    offered = set(available)
    for device_id in must_include:
        if device_id not in offered:
            raise AllocationError(
                f"must_include_deviceIDs: device ID '{device_id}' is not in available_deviceIDs"
            )
    if len(must_include) > size:
        raise AllocationError(
            f"must_include_deviceIDs holds {len(must_include)} devices, more than allocation_size {size}"
        )
    if size > len(available):
        raise AllocationError(f"allocation_size {size} exceeds the {len(available)} available devices")

"""GetPreferredAllocation for replicas and MIG devices: picks among groups of one physical device.

Replicas (time-slicing, MPS): NVIDIA's sharedDevicesAllocationPolicy, topology-aware within it
    The `must_include` replicas are taken first; the rest are picked one at a time, as NVIDIA v0.20
    picks them. The allocated count of a GPU is its replicas that are not free candidates (the
    `must_include` ones count as allocated, as in NVIDIA). Each pick takes the lowest free replica of
    the GPU that ranks first on:
      `distributed` (NVIDIA's default): 1. the fewest allocated replicas; 2. the fewest replicas taken
        by this request so far. A request spreads over distinct GPUs, least-loaded first.
      `packed`: 1. the most allocated replicas; 2. the fewest taken by this request. A request fills
        the busiest GPU that still has room before it opens another, keeping other GPUs free.
    Where NVIDIA leaves the order to Go's map iteration (random), ties go on to: 3. the most NVLink
    lanes, then 4. the highest PCIe closeness (as for whole GPUs; a replica of a GPU the request already
    holds counts as closest) to the GPUs the request already holds; 5. the lowest GPU index.
    Example, dgx-a100 time-sliced 4 ways, nothing allocated: a request for 8 gets one replica of each
    of the 8 GPUs under `distributed` (NVIDIA's answer); a request for 2 gets GPUs 0 and 1 (same PCIe
    switch). Under `packed` a request for 2 gets two replicas of GPU 0, and the next request for 2
    gets GPU 0's other two.

MIG devices: one GPU per request where possible, best fit
    The `must_include` devices are taken first. For the k devices still needed:
      1. if a GPU that `must_include` already uses has k free devices of the resource, take them from
         the one with the fewest free;
      2. else if any GPU has k free, take them from the GPU with the fewest free (best fit). The GPUs
         with many free devices stay whole for the larger requests that only they can serve;
      3. else fill from the GPUs with the most free devices first (the fewest GPUs), after the GPUs
         `must_include` uses.
    Ties go to the lowest GPU index, and within a GPU the lowest MIG indices are taken.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from nvidia_device_plugin.config.v1 import SharedAllocationPolicy
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.plans.resources import AdvertisedDevice, ResourcePlan
from nvidia_device_plugin.serving.preferred_gpus import pcie_closeness

_SAME_GPU_CLOSENESS = 6  # two replicas of one GPU are closer than any two GPUs (same board is 5)

_GroupKey = Callable[[AdvertisedDevice], str]
_WithinKey = Callable[[AdvertisedDevice], int]
_Rank = Callable[[str], tuple[int, ...]]


def _group_order(dev: AdvertisedDevice) -> tuple[int, int]:
    """GPU index, then MIG index: the order of physical devices when nothing else separates them."""
    return (dev.gpu_index, -1 if dev.mig_index is None else dev.mig_index)


def replicas_by_policy(
    plan: ResourcePlan,
    inventory: Inventory,
    devices: list[AdvertisedDevice],
    required: list[AdvertisedDevice],
    size: int,
    policy: SharedAllocationPolicy,
) -> list[AdvertisedDevice]:
    """`size` of `devices` (all of `required` first), picked one at a time by `policy` as above."""
    free = _free_by_group(devices, required, key=lambda d: d.physical_uuid, within=lambda d: d.replica or 0)
    # As NVIDIA counts it: every replica that is not a free candidate is allocated, so the must_include
    # replicas count as allocated on their GPU. Per physical device, not plan.replicas: the plan may
    # also hold unshared GPUs (those its sharing entries did not select), one ID each.
    total = plan.devices_per_physical
    load = {uuid: total[uuid] - len(group) for uuid, group in free.items()}
    gpu_of = {d.physical_uuid: d.gpu_index for d in devices}
    order = {d.physical_uuid: _group_order(d) for d in reversed(devices)}
    picked: dict[str, int] = {}
    for dev in required:
        picked[dev.physical_uuid] = picked.get(dev.physical_uuid, 0) + 1
    chosen = list(required)
    sign = 1 if policy == "distributed" else -1
    # Affinity to the GPUs the request holds changes only when it takes a GPU it did not hold: kept up to
    # date then.
    affinity = {uuid: [0, 0] for uuid in free}  # uuid -> [NVLink lanes, PCIe closeness]
    held: set[int] = set()
    for gpu in sorted({d.gpu_index for d in chosen}):
        _hold(inventory, gpu, held, affinity, gpu_of)

    def rank(u: str) -> tuple[tuple[int, ...], str]:
        return (sign * load[u], picked.get(u, 0), -affinity[u][0], -affinity[u][1], *order[u]), u

    # The groups in a heap by rank: a pick changes only its own group's rank, unless it takes a GPU the
    # request did not hold (every group's affinity changes: the heap is rebuilt, at most once per GPU).
    # So a request of 2,800 replicas over 56 groups costs 2,800 heap steps, not 2,800 passes over the groups.
    heap = [rank(u) for u, group in free.items() if group]
    heapq.heapify(heap)
    for _ in range(size - len(required)):
        best = heapq.heappop(heap)[1]
        chosen.append(free[best].pop(0))
        load[best] += 1
        picked[best] = picked.get(best, 0) + 1
        if gpu_of[best] not in held:
            _hold(inventory, gpu_of[best], held, affinity, gpu_of)
            heap = [rank(u) for u, group in free.items() if group]
            heapq.heapify(heap)
        elif free[best]:
            heapq.heappush(heap, rank(best))
    return chosen


def _hold(
    inventory: Inventory, gpu: int, held: set[int], affinity: dict[str, list[int]], gpu_of: dict[str, int]
) -> None:
    """The request now holds `gpu`: every group's affinity gains its links to it (same GPU: closest)."""
    held.add(gpu)
    for uuid, score in affinity.items():
        lanes, closeness = _affinity(inventory, gpu_of[uuid], {gpu})
        score[0] += lanes
        score[1] += closeness


def _affinity(inventory: Inventory, gpu: int, chosen: set[int]) -> tuple[int, int]:
    """NVLink lanes and PCIe closeness from `gpu` to the GPUs a request already holds (same GPU: closest)."""
    lanes = closeness = 0
    for other in chosen:
        if other == gpu:
            closeness += _SAME_GPU_CLOSENESS
            continue
        link = inventory.link(gpu, other)
        if link is not None:
            lanes += link.nvlinks
            closeness += pcie_closeness(link.pcie)
    return lanes, closeness


def pack_mig(
    devices: list[AdvertisedDevice], required: list[AdvertisedDevice], size: int
) -> list[AdvertisedDevice]:
    """`size` of the MIG `devices` (all of `required` first), by the best-fit rules above."""
    free = _free_by_group(devices, required, key=lambda d: d.gpu_uuid, within=lambda d: d.mig_index or 0)
    index = {d.gpu_uuid: d.gpu_index for d in devices}
    return _fill(
        free,
        required,
        size,
        key=lambda d: d.gpu_uuid,
        fit_rank=lambda uuid: (len(free[uuid]), index[uuid]),
        fill_rank=lambda uuid: (-len(free[uuid]), index[uuid]),
    )


def _free_by_group(
    devices: list[AdvertisedDevice],
    required: list[AdvertisedDevice],
    key: _GroupKey,
    within: _WithinKey,
) -> dict[str, list[AdvertisedDevice]]:
    """The devices not required, grouped by `key`, each group in `within` order."""
    required_ids = {d.id for d in required}
    free: dict[str, list[AdvertisedDevice]] = {}
    for dev in devices:
        group = free.setdefault(key(dev), [])
        if dev.id not in required_ids:
            group.append(dev)
    for group in free.values():
        group.sort(key=within)
    return free


def _fill(
    free: dict[str, list[AdvertisedDevice]],
    required: list[AdvertisedDevice],
    size: int,
    key: _GroupKey,
    fit_rank: _Rank,
    fill_rank: _Rank,
) -> list[AdvertisedDevice]:
    """Rules 1-3 of the MIG policy, the groups ranked by `fit_rank` (rules 1-2) and `fill_rank` (rule 3)."""
    chosen = list(required)
    need = size - len(chosen)
    if need == 0:
        return chosen
    pinned = list(dict.fromkeys(key(d) for d in required))
    for pool in (pinned, list(free)):
        fits = [g for g in pool if len(free[g]) >= need]
        if fits:
            return chosen + free[min(fits, key=fit_rank)][:need]
    pinned_set = set(pinned)
    others = sorted((g for g in free if g not in pinned_set), key=fill_rank)
    for group in sorted(pinned, key=fill_rank) + others:
        take = free[group][:need]
        chosen += take
        need -= len(take)
        if need == 0:
            break
    return chosen

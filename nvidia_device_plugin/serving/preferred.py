"""GetPreferredAllocation: which of the available devices kubelet should give a container.

kubelet passes the devices it could give (`available`), the ones it must give (`must_include`) and how
many (`size`). The answer is always exactly `size` IDs, all from `available`, including `must_include`,
and the same for the same inputs whatever their order. The policy depends on what the resource holds.

Whole GPUs: the best-connected set
    Candidate sets are compared on, in order:
      1. the NVLink lanes summed over every pair of chosen GPUs (more is better);
      2. PCIe closeness summed over every pair: 5 for the same board, 4 for one PCIe switch, 3 for
         several switches, 2 for the same host bridge, 1 for the same NUMA node, 0 across NUMA nodes;
      3. the number of distinct NUMA nodes among them (fewer is better);
      4. the GPU indices, sorted, compared as a list (lower is better), so that ties have one answer.
    The search is exact: a branch-and-bound over the combinations, pruned with an upper bound on the
    pair sums that the remaining candidates could still add.

    dgx-a100 (8 x A100 80GB on NVSwitch: every pair has 12 NVLinks; GPUs 0-3 on NUMA node 0 and 4-7 on
    node 1; pairs 0-1, 2-3, 4-5 and 6-7 share a PCIe switch). NVLink does not tell the sets apart, so
    PCIe and NUMA decide:
      * 2 GPUs, all free: {0, 1}, which share a PCIe switch.
      * 4 GPUs, all free: {0, 1, 2, 3}, one NUMA node. Closeness 4+4+1+1+1+1 = 12 beats 8 for
        {0, 1, 4, 5}.
      * 4 GPUs, GPU 0 taken: {4, 5, 6, 7}. Node 0 has only three GPUs left, and any set that spans
        both nodes scores at most 4+4 = 8 against 12.
      * 2 GPUs, GPUs 0 and 4 taken: {2, 3}, not {1, 2}: same switch beats lower index.
      * 3 GPUs that must include GPU 1, GPU 0 taken: {1, 2, 3} (closeness 1+1+4 = 6, against at most 4
        for sets that span both nodes). With GPU 0 free, {0, 1, 2} scores 4+1+1 = 6 too and wins on
        the lower indices.

    PCIe box (4 GPUs, NVLink bridges between 0-1 and 2-3 only, 12 lanes each; 0-1 on NUMA node 0 and
    2-3 on node 1):
      * 2 GPUs, all free: {0, 1}.
      * 2 GPUs, GPU 0 taken: {2, 3}. The NVLink pair beats the lower indices of {1, 2}.
      * 2 GPUs that must include GPU 1, GPU 0 taken: {1, 2}. Neither partner has NVLink to GPU 1, both
        are across NUMA nodes, and the lower index breaks the tie.
      * 3 GPUs, all free: {0, 1, 2}. {0, 1, 2} and {0, 2, 3} both hold one NVLink pair and span two
        nodes, so the lower indices decide.

MPS replicas, more than one: one GPU where one fits (sharing/mps.py, single_gpu_preference), else as below

Replicas (time-slicing, MPS): NVIDIA's sharedDevicesAllocationPolicy, topology-aware within it
    The `must_include` replicas are taken first; the rest are picked one at a time, as NVIDIA v0.20
    picks them. The allocated count of a GPU is `allocated_counts[uuid]` when the caller knows it,
    otherwise its replicas that are not free candidates (the `must_include` ones count as allocated,
    as in NVIDIA). Each pick takes the lowest free replica of the GPU that ranks first on:
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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from nvidia_device_plugin.config.v1 import SharedAllocationPolicy
from nvidia_device_plugin.devices import Inventory, PcieLevel
from nvidia_device_plugin.errors import AllocationError
from nvidia_device_plugin.resources import AdvertisedDevice, ResourcePlan
from nvidia_device_plugin.sharing.mps import single_gpu_preference

_SAME_GPU_CLOSENESS = 6  # two replicas of one GPU are closer than any two GPUs (same board is 5)

_GroupKey = Callable[[AdvertisedDevice], str]
_WithinKey = Callable[[AdvertisedDevice], int]
_Rank = Callable[[str], tuple[int, ...]]


def preferred_allocation(
    plan: ResourcePlan,
    inventory: Inventory,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    allocated_counts: Mapping[str, int] | None = None,
    policy: SharedAllocationPolicy = "distributed",
) -> list[str]:
    """The `size` device IDs of `plan` to allocate, chosen from `available` by the policy above.

    `allocated_counts` maps a physical UUID to how many of its replicas are handed out now, and `policy`
    is `flags.plugin.sharedDevicesAllocationPolicy`; both matter only for replicas. The IDs come back in
    the plan's order.
    """
    position = {d.id: n for n, d in enumerate(plan.devices)}
    available = list(dict.fromkeys(available))
    must_include = list(dict.fromkeys(must_include))
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

    if plan.sharing == "mps" and size > 1:
        # A container's MPS replicas must share one GPU (one pipe per resource): keep them together.
        together = single_gpu_preference(plan, available, must_include, size)
        if together is not None:
            return sorted(together, key=position.__getitem__)
    devices = [plan.devices[n] for n in sorted(position[i] for i in available)]
    required = [plan.devices[n] for n in sorted(position[i] for i in must_include)]
    if any(d.replica is not None for d in devices):
        chosen = _replicas_by_policy(plan, inventory, devices, required, size, allocated_counts, policy)
    elif any(d.kind == "mig" for d in devices):
        chosen = _pack_mig(devices, required, size)
    else:
        chosen = _best_connected(inventory, devices, required, size)
    return [d.id for d in sorted(chosen, key=lambda d: position[d.id])]


# ----------------------------------------------------------------------------------------------------
# Whole GPUs


def pcie_closeness(level: PcieLevel) -> int:
    """5 for the same board down to 0 across NUMA nodes (NVML's topology levels step by 10)."""
    return (PcieLevel.SYSTEM - level) // 10


_CLOSENESS_MAX = pcie_closeness(PcieLevel.INTERNAL)


@dataclass(frozen=True)
class _Key:
    """What the whole-GPU policy maximises; compare with `better`."""

    pair_score: int  # NVLink lanes * scale + PCIe closeness, summed over pairs (lexicographic in effect)
    numa_nodes: int
    indices: tuple[int, ...]

    def better(self, other: _Key | None) -> bool:
        if other is None:
            return True
        if self.pair_score != other.pair_score:
            return self.pair_score > other.pair_score
        if self.numa_nodes != other.numa_nodes:
            return self.numa_nodes < other.numa_nodes
        return self.indices < other.indices


def _best_connected(
    inventory: Inventory, devices: list[AdvertisedDevice], required: list[AdvertisedDevice], size: int
) -> list[AdvertisedDevice]:
    gpus = sorted(devices, key=lambda d: d.gpu_index)
    n = len(gpus)
    if size == n:
        return gpus
    # NVLink lanes must dominate the closeness sum, so they are scaled past its largest possible value.
    scale = _CLOSENESS_MAX * n * (n - 1) // 2 + 1
    weight = [[0] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            link = inventory.link(gpus[a].gpu_index, gpus[b].gpu_index)
            w = 0 if link is None else link.nvlinks * scale + pcie_closeness(link.pcie)
            weight[a][b] = weight[b][a] = w
    required_ids = {d.id for d in required}
    forced = [k for k, d in enumerate(gpus) if d.id in required_ids]
    candidates = [k for k, d in enumerate(gpus) if d.id not in required_ids]
    search = _Search(gpus, weight, forced, candidates, size - len(forced))
    return [gpus[k] for k in search.best()]


class _Search:
    """Branch-and-bound over `candidates` (in GPU index order) for the best `need` to add to `forced`."""

    def __init__(
        self,
        gpus: list[AdvertisedDevice],
        weight: list[list[int]],
        forced: list[int],
        candidates: list[int],
        need: int,
    ) -> None:
        self.gpus = gpus
        self.weight = weight
        self.forced = forced
        self.candidates = candidates
        self.need = need
        m = len(candidates)
        # top[c][p]: prefix sums of candidate c's pair weights to candidates[p:] (c excluded), largest
        # first. It bounds what c can add in pairs with the other picks made from candidates[p:].
        self.top: list[list[list[int]]] = []
        for c in range(m):
            rows = []
            for p in range(m + 1):
                ws = sorted(
                    (weight[candidates[c]][candidates[d]] for d in range(p, m) if d != c), reverse=True
                )
                sums = [0]
                for w in ws:
                    sums.append(sums[-1] + w)
                rows.append(sums)
            self.top.append(rows)
        self.best_key: _Key | None = None
        self.best_set: list[int] = []

    def best(self) -> list[int]:
        forced_score = sum(self.weight[a][b] for x, a in enumerate(self.forced) for b in self.forced[x + 1 :])
        gains = [sum(self.weight[f][c] for f in self.forced) for c in self.candidates]
        self._consider(self._greedy(gains), None)
        self._dfs(0, [], forced_score, gains)
        return sorted(self.best_set)

    def _key(self, chosen: list[int], score: int | None = None) -> _Key:
        members = sorted(self.forced + chosen)
        if score is None:
            score = sum(self.weight[a][b] for x, a in enumerate(members) for b in members[x + 1 :])
        numa = {self.gpus[k].numa_node for k in members}
        return _Key(score, len(numa), tuple(self.gpus[k].gpu_index for k in members))

    def _consider(self, chosen: list[int], score: int | None) -> None:
        key = self._key(chosen, score)
        if key.better(self.best_key):
            self.best_key = key
            self.best_set = sorted(self.forced + chosen)

    def _greedy(self, gains: list[int]) -> list[int]:
        """A good first answer, so that the bound prunes from the start: add the best gain each time."""
        gains = list(gains)
        left = list(range(len(self.candidates)))
        chosen: list[int] = []
        for _ in range(self.need):
            pick = max(left, key=lambda c: (gains[c], -c))
            left.remove(pick)
            chosen.append(self.candidates[pick])
            for c in left:
                gains[c] += self.weight[self.candidates[pick]][self.candidates[c]]
        return chosen

    def _dfs(self, start: int, chosen: list[int], score: int, gains: list[int]) -> None:
        need = self.need - len(chosen)
        if need == 0:
            self._consider(chosen, score)
            return
        m = len(self.candidates)
        if m - start < need:
            return
        if self._pruned(start, chosen, score, gains, need):
            return
        for c in range(start, m - need + 1):
            k = self.candidates[c]
            gained = gains[c]
            for d in range(c + 1, m):
                gains[d] += self.weight[k][self.candidates[d]]
            chosen.append(k)
            self._dfs(c + 1, chosen, score + gained, gains)
            chosen.pop()
            for d in range(c + 1, m):
                gains[d] -= self.weight[k][self.candidates[d]]

    def _pruned(self, start: int, chosen: list[int], score: int, gains: list[int], need: int) -> bool:
        best = self.best_key
        if best is None:
            return False
        # Twice the most the remaining picks can add: each pick's pairs with the members so far (twice),
        # plus its best need-1 pairs among the remaining candidates (each such pair counted from both ends).
        m = len(self.candidates)
        bounds = sorted((2 * gains[c] + self.top[c][start][need - 1] for c in range(start, m)), reverse=True)
        bound2 = 2 * score + sum(bounds[:need])
        if bound2 != 2 * best.pair_score:
            return bound2 < 2 * best.pair_score
        members = self.forced + chosen
        numa_floor = len({self.gpus[k].numa_node for k in members})
        if numa_floor != best.numa_nodes:
            return numa_floor > best.numa_nodes
        # Tied on every bound: only a lexicographically smaller set could still win, and the smallest
        # set in this subtree takes the first `need` remaining candidates.
        smallest = sorted(members + self.candidates[start : start + need])
        return tuple(self.gpus[k].gpu_index for k in smallest) >= best.indices


# ----------------------------------------------------------------------------------------------------
# Replicas and MIG devices


def _group_order(dev: AdvertisedDevice) -> tuple[int, int]:
    """GPU index, then MIG index: the order of physical devices when nothing else separates them."""
    return (dev.gpu_index, -1 if dev.mig_index is None else dev.mig_index)


def _replicas_by_policy(
    plan: ResourcePlan,
    inventory: Inventory,
    devices: list[AdvertisedDevice],
    required: list[AdvertisedDevice],
    size: int,
    allocated_counts: Mapping[str, int] | None,
    policy: SharedAllocationPolicy,
) -> list[AdvertisedDevice]:
    free = _free_by_group(devices, required, key=lambda d: d.physical_uuid, within=lambda d: d.replica or 0)
    if allocated_counts is None:
        total = plan.devices_per_physical
        # As NVIDIA counts it: every replica that is not a free candidate is allocated, so the
        # must_include replicas count as allocated on their GPU.
        load = {uuid: total[uuid] - len(group) for uuid, group in free.items()}
    else:
        load = {uuid: allocated_counts.get(uuid, 0) for uuid in free}
    gpu_of = {d.physical_uuid: d.gpu_index for d in devices}
    order = {d.physical_uuid: _group_order(d) for d in reversed(devices)}
    picked: dict[str, int] = {}
    for dev in required:
        picked[dev.physical_uuid] = picked.get(dev.physical_uuid, 0) + 1
    chosen = list(required)
    sign = 1 if policy == "distributed" else -1
    for _ in range(size - len(required)):
        held = {d.gpu_index for d in chosen}
        ranked = []
        for uuid, group in free.items():
            if group:
                lanes, closeness = _affinity(inventory, gpu_of[uuid], held)
                ranked.append(
                    ((sign * load[uuid], picked.get(uuid, 0), -lanes, -closeness, *order[uuid]), uuid)
                )
        best = min(ranked)[1]
        chosen.append(free[best].pop(0))
        load[best] += 1
        picked[best] = picked.get(best, 0) + 1
    return chosen


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


def _pack_mig(
    devices: list[AdvertisedDevice], required: list[AdvertisedDevice], size: int
) -> list[AdvertisedDevice]:
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

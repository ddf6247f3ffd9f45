"""GetPreferredAllocation for whole GPUs: the best-connected set of the available GPUs.

Whole GPUs: the best-connected set
    Candidate sets are compared on, in order:
      1. the NVLink lanes summed over every pair of chosen GPUs (more is better);
      2. PCIe closeness summed over every pair: 5 for the same board, 4 for one PCIe switch, 3 for
         several switches, 2 for the same host bridge, 1 for the same NUMA node, 0 across NUMA nodes;
      3. the number of distinct NUMA nodes among them (fewer is better);
      4. the GPU indices, sorted, compared as a list (lower is better), so that ties have one answer.
    The search is exact: a branch-and-bound over the combinations, pruned with an upper bound on the
    pair sums that the remaining candidates could still add, and started from a greedy answer. Its work
    is capped, so a request on a huge node (kubelet calls with no deadline, and a long search would
    slow every other call of the process) answers in milliseconds: after MAX_SEARCH_STEPS steps the
    best set found so far is the answer, and with more than MAX_EXACT_CANDIDATES candidates the greedy
    answer is. Every real node (up to 16 GPUs) is searched to the end.

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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from nvidia_device_plugin.devices import Inventory, PcieLevel
from nvidia_device_plugin.plans.resources import AdvertisedDevice


def pcie_closeness(level: PcieLevel) -> int:
    """5 for the same board down to 0 across NUMA nodes (NVML's topology levels step by 10)."""
    return (PcieLevel.SYSTEM - level) // 10


_CLOSENESS_MAX = pcie_closeness(PcieLevel.INTERNAL)
log = logging.getLogger(__name__)

# About 5-10 microseconds each: the search stops within ~0.1 s.
MAX_SEARCH_STEPS = 10_000
# Building the search's bound table costs candidates^3; past this, the greedy answer is taken.
MAX_EXACT_CANDIDATES = 64


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


def best_connected(
    inventory: Inventory, devices: list[AdvertisedDevice], required: list[AdvertisedDevice], size: int
) -> list[AdvertisedDevice]:
    """The best `size` of the whole-GPU `devices` that include `required`, by the ranking above."""
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
    return [gpus[k] for k in search.best(exact=len(candidates) <= MAX_EXACT_CANDIDATES)]


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
        self.steps_left = MAX_SEARCH_STEPS
        self.best_key: _Key | None = None
        self.best_set: list[int] = []

    def _bound_table(self) -> None:
        candidates, weight = self.candidates, self.weight
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

    def best(self, exact: bool = True) -> list[int]:
        """The best set; with `exact` False (too many candidates), the greedy one."""
        forced_score = sum(self.weight[a][b] for x, a in enumerate(self.forced) for b in self.forced[x + 1 :])
        gains = [sum(self.weight[f][c] for f in self.forced) for c in self.candidates]
        self._consider(self._greedy(gains), None)
        if exact:
            self._bound_table()
            self._dfs(0, [], forced_score, gains)
        if not exact or self.steps_left <= 0:
            log.debug(
                "preferred allocation of %d from %d GPUs: search capped, best set found so far",
                len(self.forced) + self.need,
                len(self.gpus),
            )
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
        self.steps_left -= 1
        if self.steps_left < 0:
            return  # out of budget: the best set so far stands
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

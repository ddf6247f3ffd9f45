"""GetPreferredAllocation policy: the docstring's worked examples, properties, and optimality."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvidia_device_plugin.base.errors import AllocationError
from nvidia_device_plugin.devices import Gpu, GpuLink, Inventory, PcieLevel
from nvidia_device_plugin.plans.resources import AdvertisedDevice, ResourcePlan, replica_id
from nvidia_device_plugin.serving.preferred import preferred_allocation

GIB = 1024**3


def _uuid(i: int) -> str:
    return f"GPU-{i:02d}"


def _inventory(numa: list[int | None], link: dict[tuple[int, int], tuple[int, PcieLevel]]) -> Inventory:
    gpus = tuple(
        Gpu(i, _uuid(i), "NVIDIA A100-SXM4-80GB", 80 * GIB, f"00000000:{i:02x}:00.0", i, node, False)
        for i, node in enumerate(numa)
    )
    return Inventory(
        gpus=gpus, links=tuple(GpuLink(a, b, nv, pcie) for (a, b), (nv, pcie) in sorted(link.items()))
    )


def _whole_plan(inventory: Inventory) -> ResourcePlan:
    return ResourcePlan(
        "nvidia.com/gpu",
        tuple(
            AdvertisedDevice(g.uuid, "gpu", g.uuid, g.uuid, g.index, None, None, g.numa_node, g.memory_bytes)
            for g in inventory.gpus
        ),
    )


def _replica_plan(gpus: int, replicas: int) -> ResourcePlan:
    return ResourcePlan(
        "nvidia.com/gpu",
        tuple(
            AdvertisedDevice(replica_id(_uuid(g), r), "gpu", _uuid(g), _uuid(g), g, None, r, 0, 80 * GIB)
            for g in range(gpus)
            for r in range(replicas)
        ),
        sharing="time-slicing",
        replicas=replicas,
    )


def _mig_plan(free_per_gpu: dict[int, int]) -> ResourcePlan:
    return ResourcePlan(
        "nvidia.com/mig-1g.10gb",
        tuple(
            AdvertisedDevice(f"MIG-{g}-{m}", "mig", f"MIG-{g}-{m}", _uuid(g), g, m, None, 0, 10 * GIB)
            for g, count in free_per_gpu.items()
            for m in range(count)
        ),
    )


def _dgx_a100() -> Inventory:
    """8 GPUs on NVSwitch (12 NVLinks a pair), 0-3 on NUMA 0 and 4-7 on NUMA 1, pairs under PCIe switches."""
    link = {}
    for a, b in itertools.combinations(range(8), 2):
        if a // 2 == b // 2:
            pcie = PcieLevel.SINGLE
        elif a // 4 == b // 4:
            pcie = PcieLevel.NODE
        else:
            pcie = PcieLevel.SYSTEM
        link[(a, b)] = (12, pcie)
    return _inventory([0, 0, 0, 0, 1, 1, 1, 1], link)


def _pcie_box() -> Inventory:
    """4 PCIe GPUs; NVLink bridges 0-1 and 2-3 only; 0-1 on NUMA 0, 2-3 on NUMA 1."""
    link = {}
    for a, b in itertools.combinations(range(4), 2):
        same_node = a // 2 == b // 2
        link[(a, b)] = (12 if same_node else 0, PcieLevel.NODE if same_node else PcieLevel.SYSTEM)
    return _inventory([0, 0, 1, 1], link)


def _pick(inventory: Inventory, available: list[int], size: int, must: Iterable[int] = ()) -> set[int]:
    plan = _whole_plan(inventory)
    ids = preferred_allocation(plan, inventory, [_uuid(i) for i in available], [_uuid(i) for i in must], size)
    return {int(i.removeprefix("GPU-")) for i in ids}


# ----------------------------------------------------------------------------------------------------
# The worked examples of the module docstring


@pytest.mark.parametrize(
    ("available", "size", "must", "expected"),
    [
        (range(8), 2, [], {0, 1}),
        (range(8), 4, [], {0, 1, 2, 3}),
        (range(1, 8), 4, [], {4, 5, 6, 7}),
        ([1, 2, 3, 5, 6, 7], 2, [], {2, 3}),
        (range(1, 8), 3, [1], {1, 2, 3}),
        (range(8), 3, [1], {0, 1, 2}),
        (range(8), 8, [], set(range(8))),
    ],
)
def test_dgx_a100_examples(available: range, size: int, must: list[int], expected: set[int]) -> None:
    assert _pick(_dgx_a100(), list(available), size, must) == expected


@pytest.mark.parametrize(
    ("available", "size", "must", "expected"),
    [
        ([0, 1, 2, 3], 2, [], {0, 1}),
        ([1, 2, 3], 2, [], {2, 3}),
        ([1, 2, 3], 2, [1], {1, 2}),
        ([0, 1, 2, 3], 3, [], {0, 1, 2}),
    ],
)
def test_pcie_box_examples(available: list[int], size: int, must: list[int], expected: set[int]) -> None:
    assert _pick(_pcie_box(), available, size, must) == expected


def test_sixteen_gpus_choosing_eight_finds_the_nvlink_island() -> None:
    # Two 8-GPU NVLink islands; the second is fully free, the first has GPU 3 taken.
    link = {}
    for a, b in itertools.combinations(range(16), 2):
        same = a // 8 == b // 8
        link[(a, b)] = (12 if same else 0, PcieLevel.NODE if same else PcieLevel.SYSTEM)
    inventory = _inventory([g // 8 for g in range(16)], link)
    available = [g for g in range(16) if g != 3]
    assert _pick(inventory, available, 8) == set(range(8, 16))
    assert _pick(inventory, available, 8, must=[0]) == {0, 1, 2, 4, 5, 6, 7, 8}


# ----------------------------------------------------------------------------------------------------
# Replicas


def test_replicas_go_to_the_least_allocated_gpu() -> None:
    plan = _replica_plan(gpus=2, replicas=4)
    # GPU 0 has replica 0 out (load 1), GPU 1 has replicas 0-2 out (load 3).
    available = [replica_id(_uuid(0), r) for r in (1, 2, 3)] + [replica_id(_uuid(1), 3)]
    inventory = _inventory([0, 0], {})
    assert preferred_allocation(plan, inventory, available, [], 1) == [replica_id(_uuid(0), 1)]
    assert preferred_allocation(plan, inventory, available, [], 2) == [
        replica_id(_uuid(0), r) for r in (1, 2)
    ]
    assert preferred_allocation(plan, inventory, available, [], 4) == available


def _gpus_of(ids: list[str]) -> list[int]:
    return [int(i.split("::")[0].removeprefix("GPU-")) for i in ids]


def test_distributed_spreads_one_request_over_distinct_gpus_as_nvidia_does() -> None:
    # NVIDIA's default: a pod asking for 8 time-sliced GPUs on a DGX A100 gets 8 physical GPUs.
    plan = _replica_plan(gpus=8, replicas=4)
    available = [d.id for d in plan.devices]
    result = preferred_allocation(plan, _dgx_a100(), available, [], 8)
    assert sorted(_gpus_of(result)) == list(range(8))
    # 4 replicas: 4 distinct GPUs, the ones one NUMA node holds (topology breaks NVIDIA's random tie).
    assert sorted(_gpus_of(preferred_allocation(plan, _dgx_a100(), available, [], 4))) == [0, 1, 2, 3]
    # 2 replicas: GPUs 0 and 1, which share a PCIe switch.
    assert sorted(_gpus_of(preferred_allocation(plan, _dgx_a100(), available, [], 2))) == [0, 1]


def test_distributed_goes_to_the_least_allocated_gpus_first() -> None:
    plan = _replica_plan(gpus=3, replicas=4)
    available = [d.id for d in plan.devices if d.gpu_index != 0 or d.replica == 3]  # GPU 0: 3 out
    result = preferred_allocation(plan, _inventory([0] * 3, {}), available, [], 3)
    # GPUs 1 and 2 (0 allocated) first, one each; then they have 1 each against GPU 0's 3.
    assert _gpus_of(result) == [1, 1, 2]


def test_distributed_counts_must_include_as_allocated_on_its_gpu() -> None:
    plan = _replica_plan(gpus=2, replicas=4)
    available = [d.id for d in plan.devices]
    must = [replica_id(_uuid(1), 2)]
    result = preferred_allocation(plan, _inventory([0, 0], {}), available, must, 3)
    # GPU 1 holds the required replica (1 allocated), so GPU 0 (0) goes first, then they tie on 1 and
    # GPU 1 has given this request more already: GPU 0 again.
    assert result == [replica_id(_uuid(0), 0), replica_id(_uuid(0), 1), replica_id(_uuid(1), 2)]


def test_packed_fills_the_busiest_gpu_that_has_room_first() -> None:
    plan = _replica_plan(gpus=3, replicas=4)
    inventory = _inventory([0] * 3, {})
    everything = [d.id for d in plan.devices]
    first = preferred_allocation(plan, inventory, everything, [], 2, policy="packed")
    assert first == [replica_id(_uuid(0), 0), replica_id(_uuid(0), 1)]
    rest = [i for i in everything if i not in first]
    second = preferred_allocation(plan, inventory, rest, [], 3, policy="packed")
    # GPU 0 (2 allocated) is filled before GPU 1 is opened.
    assert second == [replica_id(_uuid(0), 2), replica_id(_uuid(0), 3), replica_id(_uuid(1), 0)]


def test_packed_prefers_a_gpu_near_the_ones_the_request_holds_on_a_tie() -> None:
    plan = _replica_plan(gpus=8, replicas=1)
    available = [d.id for d in plan.devices if d.gpu_index not in (0, 1)]
    must = [replica_id(_uuid(5), 0)]
    # One replica per GPU: every GPU ties on allocated count; GPU 4 shares GPU 5's PCIe switch.
    result = preferred_allocation(plan, _dgx_a100(), available, must, 2, policy="packed")
    assert sorted(_gpus_of(result)) == [4, 5]


# ----------------------------------------------------------------------------------------------------
# MIG


def test_mig_request_goes_to_the_gpu_it_fits_best() -> None:
    plan = _mig_plan({0: 7, 1: 3})
    available = [d.id for d in plan.devices]
    inventory = _inventory([0, 0], {})
    assert preferred_allocation(plan, inventory, available, [], 2) == ["MIG-1-0", "MIG-1-1"]
    assert preferred_allocation(plan, inventory, available, [], 4) == [f"MIG-0-{m}" for m in range(4)]


def test_mig_request_too_big_for_one_gpu_fills_the_emptiest_first() -> None:
    plan = _mig_plan({0: 3, 1: 7})
    available = [d.id for d in plan.devices]
    result = preferred_allocation(plan, _inventory([0, 0], {}), available, [], 9)
    assert result == [f"MIG-0-{m}" for m in range(2)] + [f"MIG-1-{m}" for m in range(7)]


def test_mig_request_follows_must_include() -> None:
    plan = _mig_plan({0: 3, 1: 7})
    available = [d.id for d in plan.devices]
    result = preferred_allocation(plan, _inventory([0, 0], {}), available, ["MIG-1-5"], 2)
    assert result == ["MIG-1-0", "MIG-1-5"]


# ----------------------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize(
    ("available", "must", "size", "message"),
    [
        ([0, 1], [], 0, r"allocation_size must be >= 1, got 0"),
        ([0, 1], [], 3, r"allocation_size 3 exceeds the 2 available devices"),
        ([0, 1], [2], 1, r"must_include_deviceIDs: device ID 'GPU-02' is not in available_deviceIDs"),
        ([0, 1, 2], [0, 1], 1, r"must_include_deviceIDs holds 2 devices, more than allocation_size 1"),
    ],
)
def test_bad_requests_are_refused(available: list[int], must: list[int], size: int, message: str) -> None:
    inventory = _pcie_box()
    with pytest.raises(AllocationError, match=message):
        preferred_allocation(
            _whole_plan(inventory), inventory, [_uuid(i) for i in available], [_uuid(i) for i in must], size
        )


@pytest.mark.parametrize("field", ["available_deviceIDs", "must_include_deviceIDs"])
def test_ids_outside_the_plan_are_refused(field: str) -> None:
    inventory = _pcie_box()
    available = ["GPU-00", "GPU-99"] if field == "available_deviceIDs" else ["GPU-00"]
    must = ["GPU-99"] if field == "must_include_deviceIDs" else []
    with pytest.raises(
        AllocationError, match=rf"{field}: unknown device ID 'GPU-99' for resource nvidia.com/gpu"
    ):
        preferred_allocation(_whole_plan(inventory), inventory, available, must, 1)


# ----------------------------------------------------------------------------------------------------
# Properties


@st.composite
def _topologies(draw: st.DrawFn, max_gpus: int = 6) -> Inventory:
    n = draw(st.integers(1, max_gpus))
    numa = draw(st.lists(st.sampled_from([0, 1, None]), min_size=n, max_size=n))
    # Few distinct link kinds per topology, as on real nodes: ties are common and must be broken right.
    nvlinks = draw(st.lists(st.sampled_from([0, 1, 2, 4, 12]), min_size=1, max_size=2, unique=True))
    levels = draw(st.lists(st.sampled_from(list(PcieLevel)), min_size=1, max_size=3, unique=True))
    link = {}
    for a, b in itertools.combinations(range(n), 2):
        if draw(st.integers(0, 9)):  # now and then a pair has no link record at all
            link[(a, b)] = (draw(st.sampled_from(nvlinks)), draw(st.sampled_from(levels)))
    return _inventory(numa, link)


@st.composite
def _whole_gpu_requests(draw: st.DrawFn) -> tuple[Inventory, list[str], list[str], int]:
    inventory = draw(_topologies())
    ids = [g.uuid for g in inventory.gpus]
    available = draw(st.lists(st.sampled_from(ids), min_size=1, unique=True))
    size = draw(st.integers(1, len(available)))
    must = draw(st.lists(st.sampled_from(available), max_size=size, unique=True))
    return inventory, available, must, size


def _brute_force(inventory: Inventory, available: list[str], must: list[str], size: int) -> set[str]:
    """The documented whole-GPU rule, applied to every combination."""
    gpus = {g.uuid: g for g in inventory.gpus}
    links = {(link.a, link.b): link for link in inventory.links}

    def key(combo: Iterable[str]) -> tuple[int, int, int, tuple[int, ...]]:
        indices = sorted(gpus[u].index for u in combo)
        nvlinks = closeness = 0
        for a, b in itertools.combinations(indices, 2):
            link = links.get((a, b))
            if link is not None:
                nvlinks += link.nvlinks
                closeness += {50: 0, 40: 1, 30: 2, 20: 3, 10: 4, 0: 5}[int(link.pcie)]
        numa = len({gpus[u].numa_node for u in combo})
        return (-nvlinks, -closeness, numa, tuple(indices))

    combos = [c for c in itertools.combinations(available, size) if set(must) <= set(c)]
    return set(min(combos, key=key))


@settings(max_examples=150, deadline=None)
@given(_whole_gpu_requests())
def test_whole_gpu_choice_is_the_brute_force_optimum(
    request: tuple[Inventory, list[str], list[str], int],
) -> None:
    inventory, available, must, size = request
    result = preferred_allocation(_whole_plan(inventory), inventory, available, must, size)
    assert set(result) == _brute_force(inventory, available, must, size)


def test_tie_heavy_random_topologies_match_the_brute_force_optimum() -> None:
    # Seeded rather than drawn by hypothesis: ties that only the index rule breaks are rare enough that a
    # fixed, larger sample finds the pruning mistakes a few hundred examples miss.
    rng = random.Random(1)
    for _ in range(1500):
        n = rng.randrange(3, 9)
        nvlinks = rng.choice([[0, 12], [0, 0, 1, 2], [12], [0]])
        levels = [PcieLevel.SINGLE, PcieLevel.NODE, PcieLevel.SYSTEM]
        link = {
            (a, b): (rng.choice(nvlinks), rng.choice(levels)) for a, b in itertools.combinations(range(n), 2)
        }
        inventory = _inventory([rng.randrange(2) for _ in range(n)], link)
        available = [g.uuid for g in inventory.gpus if rng.random() < 0.85] or [inventory.gpus[0].uuid]
        size = rng.randrange(1, len(available) + 1)
        must = rng.sample(available, rng.randrange(0, min(2, size) + 1))
        result = preferred_allocation(_whole_plan(inventory), inventory, available, must, size)
        assert set(result) == _brute_force(inventory, available, must, size), (link, available, must, size)


@st.composite
def _any_requests(
    draw: st.DrawFn,
) -> tuple[ResourcePlan, Inventory, list[str], list[str], int, dict[str, int] | None]:
    kind = draw(st.sampled_from(["whole", "replica", "mig"]))
    inventory = draw(_topologies())
    gpus = len(inventory.gpus)
    if kind == "whole":
        plan = _whole_plan(inventory)
    elif kind == "replica":
        plan = _replica_plan(gpus, draw(st.integers(1, 4)))
    else:
        plan = _mig_plan({g: draw(st.integers(1, 4)) for g in range(gpus)})
    ids = [d.id for d in plan.devices]
    available = draw(st.lists(st.sampled_from(ids), min_size=1, unique=True))
    size = draw(st.integers(1, len(available)))
    must = draw(st.lists(st.sampled_from(available), max_size=size, unique=True))
    counts = draw(
        st.none() | st.dictionaries(st.sampled_from([_uuid(g) for g in range(gpus)]), st.integers(0, 9))
    )
    return plan, inventory, available, must, size, counts


@settings(max_examples=150, deadline=None)
@given(_any_requests(), st.randoms(use_true_random=False))
def test_every_answer_is_exact_offered_complete_and_order_blind(
    request: tuple[ResourcePlan, Inventory, list[str], list[str], int, dict[str, int] | None],
    rng: random.Random,
) -> None:
    plan, inventory, available, must, size, counts = request
    result = preferred_allocation(plan, inventory, available, must, size, counts)
    assert len(result) == size == len(set(result))
    assert set(result) <= set(available)
    assert set(must) <= set(result)
    shuffled_available, shuffled_must = list(available), list(must)
    rng.shuffle(shuffled_available)
    rng.shuffle(shuffled_must)
    assert preferred_allocation(plan, inventory, shuffled_available, shuffled_must, size, counts) == result


def test_mps_replicas_stay_on_one_gpu_and_the_request_is_checked_first() -> None:
    plan = replace(_replica_plan(2, 4), sharing="mps")
    inventory = _inventory([0, 0], {})
    available = [replica_id(_uuid(0), r) for r in range(4)] + [replica_id(_uuid(1), r) for r in (1, 3)]
    assert preferred_allocation(plan, inventory, available, [], 2) == [
        replica_id(_uuid(1), 1),
        replica_id(_uuid(1), 3),
    ]
    must = [replica_id(_uuid(0), 3)]
    assert preferred_allocation(plan, inventory, available, must, 2) == [
        replica_id(_uuid(0), 0),
        replica_id(_uuid(0), 3),
    ]
    # The single-GPU shortcut answers only requests the checks let through.
    with pytest.raises(AllocationError, match="is not in available_deviceIDs"):
        preferred_allocation(plan, inventory, available[1:], [replica_id(_uuid(0), 0)], 2)
    with pytest.raises(AllocationError, match="unknown device ID 'bogus'"):
        preferred_allocation(plan, inventory, [*available, "bogus"], [], 2)

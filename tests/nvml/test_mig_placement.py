"""GPU-instance placements: the simulator places MIG layouts as the hardware allows, refuses the ones it
cannot hold, and discovery reads each MIG device's placement and profile ID (the DRA device name's parts)."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.sim.node import load_node, parse_node, preset_names
from nvidia_device_plugin.nvml.sim.placement import fit_placements
from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml

A100 = "NVIDIA A100-SXM4-80GB"


def _discover(doc: dict[str, object], tmp_path: Path) -> list[list[tuple[str, tuple[int, int] | None]]]:
    sim = SimulatedNvml(parse_node(doc, "node"))
    sim.nvmlInit()
    try:
        inventory = discover(sim, tmp_path)
    finally:
        sim.close()
    return [[(m.profile, m.placement) for m in g.mig_devices] for g in inventory.gpus]


@pytest.mark.parametrize(
    ("instances", "expected"),
    [
        ([(1, 1)] * 7, [(s, 1) for s in range(7)]),  # a 1g may not start at 7: no compute slice is left
        ([(7, 8)], [(0, 8)]),
        ([(3, 4), (2, 2), (1, 1), (1, 1)], [(4, 4), (0, 2), (2, 1), (3, 1)]),  # 3g at 0 would leave no room
        ([(4, 4), (3, 4)], [(0, 4), (4, 4)]),
        ([(2, 2), (2, 2), (2, 2), (1, 1)], [(0, 2), (2, 2), (4, 2), (6, 1)]),
    ],
)
def test_layouts_the_hardware_holds_are_placed(
    instances: list[tuple[int, int]], expected: list[tuple[int, int]]
) -> None:
    assert fit_placements(instances, 8, 7) == expected


@pytest.mark.parametrize(
    "instances",
    [
        [(1, 1)] * 8,  # eight 1g instances: seven compute slices
        [(4, 4), (4, 4)],  # a 4g only starts at 0
        [(7, 8), (1, 1)],
        [(3, 4), (3, 4), (1, 1)],
        [(2, 2)] * 4,  # a 2g cannot start at 6
    ],
)
def test_layouts_the_hardware_cannot_hold_are_not_placed(instances: list[tuple[int, int]]) -> None:
    assert fit_placements(instances, 8, 7) is None


def test_a_node_file_whose_mig_layout_fits_no_placement_is_refused_naming_the_gpu() -> None:
    doc = {
        "gpus": [
            {"name": A100, "memory_mib": 81920},
            {"name": A100, "memory_mib": 81920, "mig": ["4g.40gb"] * 2},
        ]
    }
    with pytest.raises(ConfigError, match=r"gpus\[1\]\.mig: MIG devices 4g\.40gb, 4g\.40gb do not fit"):
        parse_node(doc, "node.yaml")


def test_discovery_reads_placements_and_profile_ids(tmp_path: Path) -> None:
    doc = {"gpus": [{"name": A100, "memory_mib": 81920, "mig": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}]}
    assert _discover(doc, tmp_path) == [
        [("3g.40gb", (4, 4)), ("2g.20gb", (0, 2)), ("1g.10gb", (2, 1)), ("1g.10gb", (3, 1))]
    ]
    sim = SimulatedNvml(parse_node(doc, "node"))
    sim.nvmlInit()
    mig = discover(sim, tmp_path).gpus[0].mig_devices[0]
    sim.close()
    # NVML's profile ID of the instance: NVIDIA's, 9 for 3g.40gb on A100-80GB.
    assert mig.gi_profile_info_id == 9
    assert mig.profile_id == pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE


def test_a30_has_four_slices(tmp_path: Path) -> None:
    doc = {"gpus": [{"name": "NVIDIA A30", "memory_mib": 24576, "mig": ["2g.12gb", "1g.6gb", "1g.6gb"]}]}
    assert _discover(doc, tmp_path) == [[("2g.12gb", (0, 2)), ("1g.6gb", (2, 1)), ("1g.6gb", (3, 1))]]
    with pytest.raises(ConfigError, match="4 memory and 4 compute slices"):
        parse_node({"gpus": [{"name": "NVIDIA A30", "memory_mib": 24576, "mig": ["2g.12gb"] * 3}]}, "a30")


def test_without_permission_no_mig_device_is_read_so_none_lacks_a_placement(tmp_path: Path) -> None:
    doc = {"unprivileged_container": True, "gpus": [{"name": A100, "memory_mib": 81920, "mig": ["1g.10gb"]}]}
    # MIG enumeration itself needs CAP_SYS_ADMIN: the GPU is served without MIG devices (a problem says so).
    assert _discover(doc, tmp_path) == [[]]


def test_a_failing_instance_query_leaves_the_placement_unknown_and_says_so(tmp_path: Path) -> None:
    sim = SimulatedNvml(load_node("a100-mig-single"))
    sim.nvmlInit()
    sim.fail_always("nvmlGpuInstanceGetInfo", pynvml.NVML_ERROR_UNKNOWN)
    inventory = discover(sim, tmp_path)
    sim.close()
    migs = [m for g in inventory.gpus for m in g.mig_devices]
    assert migs and all(m.placement is None and m.gi_profile_info_id is None for m in migs)
    assert any(p.call == "nvmlDeviceGetGpuInstanceById" for p in inventory.problems)


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_mig_device_has_a_placement_of_its_own(preset: str, tmp_path: Path) -> None:
    sim = SimulatedNvml(load_node(preset))
    sim.nvmlInit()
    inventory = discover(sim, tmp_path)
    sim.close()
    for gpu in inventory.gpus:
        taken: set[int] = set()
        for mig in gpu.mig_devices:
            assert mig.placement is not None and mig.gi_profile_info_id is not None
            start, size = mig.placement
            slices = set(range(start, start + size))
            assert not slices & taken, f"{preset}: {mig.label} overlaps another instance"
            taken |= slices

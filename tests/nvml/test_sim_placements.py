"""The simulator's GPU-instance profiles are NVIDIA's: profile IDs, names and possible placements as
`nvidia-smi mig -lgip` / `-lgipp` list them on A100 (40 and 80 GB), H100, H200 and B200, and discovery
turns them into Gpu.mig_placements."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pynvml
import pytest

from nvidia_device_plugin.devices import Gpu
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.sim.node import load_node, parse_node
from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml

# NVIDIA's MIG user guide ("Supported MIG Profiles") and nvidia-smi mig -lgip: the GPU, its memory, and the
# memory figures of its profile names (1 slice, 2 slices, 4 slices, the whole GPU).
GPUS = {
    "NVIDIA A100-SXM4-40GB": (40960, (5, 10, 20, 40)),
    "NVIDIA A100-SXM4-80GB": (81920, (10, 20, 40, 80)),
    "NVIDIA H100 80GB HBM3": (81559, (10, 20, 40, 80)),
    "NVIDIA H200": (143771, (18, 35, 71, 141)),
    "NVIDIA B200": (183359, (23, 45, 90, 180)),
}


def published(gb: tuple[int, int, int, int]) -> dict[str, tuple[int, list[int], int]]:
    """profile name -> (NVIDIA's profile ID, the starts -lgipp lists, memory slices), as published."""
    one, two, four, whole = gb
    return {
        f"1g.{one}gb": (19, [0, 1, 2, 3, 4, 5, 6], 1),
        f"1g.{one}gb+me": (20, [0, 1, 2, 3, 4, 5, 6], 1),
        f"1g.{two}gb": (15, [0, 2, 4, 6], 2),
        f"2g.{two}gb": (14, [0, 2, 4], 2),
        f"3g.{four}gb": (9, [0, 4], 4),
        f"4g.{four}gb": (5, [0], 4),
        f"7g.{whole}gb": (0, [0], 8),
    }


@contextmanager
def _sim(doc: dict[str, object]) -> Iterator[SimulatedNvml]:
    sim = SimulatedNvml(parse_node(doc, "node"))
    sim.nvmlInit()
    try:
        yield sim
    finally:
        sim.close()


def _discovered_gpu(name: str, memory_mib: int, tmp_path: Path) -> Gpu:
    with _sim({"gpus": [{"name": name, "memory_mib": memory_mib, "mig": []}]}) as sim:
        return discover(sim, tmp_path).gpus[0]


@pytest.mark.parametrize("name", list(GPUS))
def test_discovered_placements_are_nvidias_published_table(name: str, tmp_path: Path) -> None:
    memory_mib, gb = GPUS[name]
    gpu = _discovered_gpu(name, memory_mib, tmp_path)
    found: dict[str, tuple[int, list[int], int]] = {}
    for option in gpu.mig_placements:
        gi_id, starts, _ = found.setdefault(option.profile, (option.gi_profile_id, [], option.size))
        assert gi_id == option.gi_profile_id
        starts.append(option.start)
    assert found == published(gb)
    assert gpu.mig_memory_slices == 8


@pytest.mark.parametrize("name", list(GPUS))
def test_every_placement_follows_nvidias_placement_rule_and_none_is_missing(
    name: str, tmp_path: Path
) -> None:
    # A GPU instance covers `size` memory slices from a multiple of `size`; its compute slices, from the same
    # start, must fit in the 7 there are. Every start that rule allows is listed.
    gpu = _discovered_gpu(name, GPUS[name][0], tmp_path)
    by_profile: dict[str, list[int]] = {}
    for option in gpu.mig_placements:
        assert option.attributes is not None
        compute = option.attributes.gpu_instance_slices
        assert option.start % option.size == 0 and option.start + option.size <= 8
        assert option.start + compute <= 7
        by_profile.setdefault(option.profile, []).append(option.start)
    for option in gpu.mig_placements:
        assert option.attributes is not None
        compute = option.attributes.gpu_instance_slices
        allowed = [s for s in range(0, 8, option.size) if s + option.size <= 8 and s + compute <= 7]
        assert by_profile[option.profile] == allowed


def test_a_placement_carries_what_its_mig_device_will_report(tmp_path: Path) -> None:
    gpu = _discovered_gpu("NVIDIA A100-SXM4-80GB", 81920, tmp_path)
    three = next(o for o in gpu.mig_placements if o.profile == "3g.40gb")
    assert three.attributes is not None
    assert (three.multiprocessors, three.attributes.gpu_instance_slices) == (42, 3)  # 14 SMs a slice on A100
    assert three.memory_bytes == three.attributes.memory_mb * 1024 * 1024
    assert 0.45 * 80 * 1024**3 < three.memory_bytes <= 0.5 * 80 * 1024**3  # half the memory, a little less


def test_gpus_outside_mig_mode_have_no_placements(tmp_path: Path) -> None:
    doc = {
        "gpus": [
            {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920},
            {"name": "Tesla T4", "memory_mib": 15360},
        ]
    }
    with _sim(doc) as sim:
        gpus = discover(sim, tmp_path).gpus
        assert [(g.mig_placements, g.mig_memory_slices) for g in gpus] == [((), 0), ((), 0)]


def test_the_dynamic_preset_is_two_a100s_in_mig_mode_without_mig_devices(tmp_path: Path) -> None:
    sim = SimulatedNvml(load_node("a100-mig-dynamic"))
    sim.nvmlInit()
    try:
        gpus = discover(sim, tmp_path).gpus
    finally:
        sim.close()
    assert [(g.name, g.mig_enabled, g.mig_devices, len(g.mig_placements)) for g in gpus] == [
        ("NVIDIA A100-SXM4-80GB", True, (), 25)
    ] * 2


def test_a_failing_placement_read_is_a_problem_and_leaves_only_that_profile_out(tmp_path: Path) -> None:
    with _sim({"gpus": [{"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "mig": []}]}) as sim:
        sim.fail_next("nvmlDeviceGetGpuInstancePossiblePlacements", pynvml.NVML_ERROR_UNKNOWN)
        inventory = discover(sim, tmp_path)
        problems = [p for p in inventory.problems if p.call == "nvmlDeviceGetGpuInstancePossiblePlacements"]
        assert len(problems) == 1 and "left out" in problems[0].message
        assert {o.profile for o in inventory.gpus[0].mig_placements} == set(published((10, 20, 40, 80))) - {
            "1g.10gb"  # the first profile asked
        }
        assert not inventory.gpus[0].lost


def test_possible_placements_count_first_then_fill_and_a_short_array_is_insufficient_size() -> None:
    with _sim({"gpus": [{"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "mig": []}]}) as sim:
        gpu = sim.nvmlDeviceGetHandleByIndex(0)
        count = ctypes.c_uint(0)
        sim.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, 15, None, ctypes.byref(count))
        assert count.value == 4
        short = (pynvml.c_nvmlGpuInstancePlacement_t * 2)()
        with pytest.raises(pynvml.NVMLError) as refused:
            sim.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, 15, short, ctypes.byref(count))
        assert refused.value.value == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        with pytest.raises(pynvml.NVMLError) as unknown:
            sim.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, 42, None, ctypes.byref(count))
        assert unknown.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_a_gpu_without_mig_answers_not_supported() -> None:
    with _sim({"gpus": [{"name": "Tesla T4", "memory_mib": 15360}]}) as sim:
        gpu = sim.nvmlDeviceGetHandleByIndex(0)
        for call in (
            lambda: sim.nvmlDeviceGetGpuInstanceProfileInfo(gpu, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE),
            lambda: sim.nvmlDeviceGetGpuInstancePossiblePlacements(
                gpu, 19, None, ctypes.byref(ctypes.c_uint())
            ),
            lambda: sim.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 19),
        ):
            with pytest.raises(pynvml.NVMLError) as exc:
                call()
            assert exc.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_node_file_instances_hold_their_slices_and_stay_where_they_were() -> None:
    doc = {"gpus": [{"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "mig": ["3g.40gb"]}]}
    with _sim(doc) as sim:
        gpu = sim.nvmlDeviceGetHandleByIndex(0)
        assert sim.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 9) == 1
        assert sim.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 0) == 0  # 7g: slices taken
        with pytest.raises(pynvml.NVMLError) as taken:
            sim.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, pynvml.c_nvmlGpuInstancePlacement_t(0, 4))
        assert taken.value.value == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
        made = sim.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, pynvml.c_nvmlGpuInstancePlacement_t(4, 4))
        assert (sim.nvmlGpuInstanceGetInfo(made).placement.start, sim.nvmlGpuInstanceGetInfo(made).id) == (
            4,
            2,
        )
        sim.nvmlGpuInstanceDestroy(made)
        mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
        first = sim.nvmlDeviceGetGpuInstanceById(gpu, sim.nvmlDeviceGetGpuInstanceId(mig))
        info = sim.nvmlGpuInstanceGetInfo(first)
        assert (info.profileId, info.placement.start, info.placement.size) == (9, 0, 4)


def test_gpu_instances_are_listed_and_one_with_its_compute_instance_is_in_use() -> None:
    with _sim({"gpus": [{"name": "NVIDIA H200", "memory_mib": 143771, "mig": []}]}) as sim:
        gpu = sim.nvmlDeviceGetHandleByIndex(0)
        gi = sim.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 14, pynvml.c_nvmlGpuInstancePlacement_t(2, 2))
        listed = (pynvml.c_nvmlGpuInstance_t * 3)()
        count = ctypes.c_uint(0)
        sim.nvmlDeviceGetGpuInstances(gpu, 14, listed, ctypes.byref(count))
        assert (
            count.value == 1 and sim.nvmlGpuInstanceGetInfo(listed[0]).id == sim.nvmlGpuInstanceGetInfo(gi).id
        )
        assert sim.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 14) == 2
        info = sim.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi,
            pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
            pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
        )
        ci = sim.nvmlGpuInstanceCreateComputeInstance(gi, info.id)
        with pytest.raises(pynvml.NVMLError) as in_use:
            sim.nvmlGpuInstanceDestroy(gi)
        assert in_use.value.value == pynvml.NVML_ERROR_IN_USE
        mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
        assert sim.nvmlDeviceGetName(mig) == "NVIDIA H200 MIG 2g.35gb"
        sim.nvmlComputeInstanceDestroy(ci)
        sim.nvmlGpuInstanceDestroy(gi)
        assert sim.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 14) == 3


class _GarbageCount(SimulatedNvml):
    """A driver answering an absurd placement count: discovery must not size an array by it."""

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: object, profileId: int, placementsRef: object, countRef: object
    ) -> int:
        count: Any = countRef  # ctypes.byref(c_uint())
        count._obj.value = 1_000_000
        return 0


def test_a_placement_count_past_the_bound_is_a_problem_not_an_allocation(tmp_path: Path) -> None:
    sim = _GarbageCount(
        parse_node({"gpus": [{"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "mig": []}]}, "n")
    )
    sim.nvmlInit()
    try:
        inventory = discover(sim, tmp_path)
    finally:
        sim.close()
    assert inventory.gpus[0].mig_placements == () and not inventory.gpus[0].lost
    assert any("1000000 placements" in p.message and "more than 32" in p.message for p in inventory.problems)

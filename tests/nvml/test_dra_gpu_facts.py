"""GPU facts read for DRA: the PCIe root complex (from where sysfs places the device), brand, architecture."""

from __future__ import annotations

from pathlib import Path

import pynvml

from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.pci import read_pcie_root
from nvidia_device_plugin.nvml.sim.node import load_node
from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml


def test_discovery_reads_each_gpus_root_complex_from_the_simulated_sysfs() -> None:
    sim = SimulatedNvml(load_node("dgx-a100"))
    sim.nvmlInit()
    inventory = discover(sim, sim.materialize_host().sysfs_root)
    sim.close()
    # GPUs paired under one PCIe switch (buses 07/0F, 47/4E, ...) share their root complex.
    assert [g.pcie_root for g in inventory.gpus] == [
        "pci0000:00",
        "pci0000:00",
        "pci0000:40",
        "pci0000:40",
        "pci0000:80",
        "pci0000:80",
        "pci0000:a0",
        "pci0000:a0",
    ]


def test_a_device_sysfs_does_not_place_under_a_root_has_none(tmp_path: Path) -> None:
    (tmp_path / "bus/pci/devices/0000:07:00.0").mkdir(parents=True)  # a plain directory, no link
    assert read_pcie_root("00000000:07:00.0", tmp_path) is None
    assert read_pcie_root("00000000:08:00.0", tmp_path) is None  # absent
    loop = tmp_path / "bus/pci/devices/0000:09:00.0"
    loop.symlink_to(loop)
    assert read_pcie_root("00000000:09:00.0", tmp_path) is None


def test_brand_and_architecture_are_read_as_go_nvlib_spells_them() -> None:
    for preset, expected in (
        ("dgx-a100", ("Nvidia", "Ampere")),
        ("t4-single", ("Tesla", "Turing")),
        ("dgx-h100", ("Nvidia", "Hopper")),
        ("b200", ("Nvidia", "Blackwell")),
    ):
        sim = SimulatedNvml(load_node(preset))
        sim.nvmlInit()
        gpu = discover(sim, sim.materialize_host().sysfs_root).gpus[0]
        sim.close()
        assert (gpu.brand, gpu.architecture) == expected, preset


def test_a_brand_nvml_will_not_give_is_left_out_with_a_problem() -> None:
    sim = SimulatedNvml(load_node("dgx-a100"))
    sim.nvmlInit()
    sim.fail_always("nvmlDeviceGetBrand", pynvml.NVML_ERROR_UNKNOWN, gpu=1)
    inventory = discover(sim, sim.materialize_host().sysfs_root)
    sim.close()
    assert [g.brand for g in inventory.gpus[:3]] == ["Nvidia", None, "Nvidia"]
    assert any(p.call == "nvmlDeviceGetBrand" and p.gpu_index == 1 for p in inventory.problems)

"""The PCIe root complex of each GPU, read from where sysfs places the device (DRA's pcieRoot)."""

from __future__ import annotations

from pathlib import Path

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

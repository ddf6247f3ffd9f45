"""GFD v0.20's rules where an older reading of GFD differed, each pinned with NVIDIA's observed value
(issue 22, measured side by side with NVIDIA's gpu-feature-discovery on the same simulated node)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml

from nvidia_device_plugin.config.v1 import Config, Flags
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.labels import LabelSettings, node_labels
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.sim.node import load_node, parse_node
from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml

N = "nvidia.com/"
A100 = {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920}


def discovered(
    node: dict[str, Any] | str, lose: tuple[str, int] | None = None, sysfs: Path | None = None
) -> Inventory:
    """Discovery of `node`; `lose` = (call, GPU) answers GPU_IS_LOST from the start; `sysfs` replaces the
    simulated sysfs (an empty one: nothing there can be read)."""
    sim = SimulatedNvml(load_node(node) if isinstance(node, str) else parse_node(node, "test"))
    sim.nvmlInit()
    if lose is not None:
        sim.fail_always(lose[0], pynvml.NVML_ERROR_GPU_IS_LOST, gpu=lose[1])
    try:
        host = sim.materialize_host()
        return discover(sim, sysfs or host.sysfs_root, host.proc_root)
    finally:
        sim.close()


def gpu_keys(labels: dict[str, str]) -> dict[str, str]:
    return {k.removeprefix(N + "gpu."): v for k, v in labels.items() if k.startswith(N + "gpu.")}


def test_gpus_of_different_pci_classes_are_mode_unknown() -> None:
    node = {"gpus": [{**A100, "pci_class": "0x030200"}, {**A100, "pci_class": "0x030000"}]}
    assert node_labels(discovered(node), Config())[N + "gpu.mode"] == "unknown"
    # and the order does not matter (we used to take the first GPU's class)
    node["gpus"].reverse()
    assert node_labels(discovered(node), Config())[N + "gpu.mode"] == "unknown"


def test_a_pci_class_that_cannot_be_read_is_mode_unknown(tmp_path: Path) -> None:
    # GFD: "failed to get device classes" -> gpu.mode=unknown (the label is kept).
    inventory = discovered("dgx-a100", sysfs=tmp_path / "empty-sysfs")
    assert node_labels(inventory, Config())[N + "gpu.mode"] == "unknown"


def test_all_graphics_gpus_are_mode_graphics() -> None:
    node = {"gpus": [{**A100, "pci_class": "0x030000"}] * 2}
    assert node_labels(discovered(node), Config())[N + "gpu.mode"] == "graphics"


def test_compute_capability_13_is_rubin() -> None:
    node = {"gpus": [{"name": "NVIDIA Rubin", "memory_mib": 294912, "compute_capability": "13.0"}]}
    labels = node_labels(discovered(node), Config())
    assert (labels[N + "gpu.family"], labels[N + "gpu.compute.major"]) == ("rubin", "13")


def test_broken_single_layout_has_an_empty_sharing_strategy() -> None:
    labels = node_labels(discovered("a100-mig-mixed"), Config(flags=Flags(mig_strategy="single")))
    gpu = gpu_keys(labels)
    assert {k: gpu[k] for k in ("product", "count", "replicas", "memory", "sharing-strategy")} == {
        "product": "NVIDIA-A100-SXM4-80GB-MIG-INVALID",
        "count": "0",
        "replicas": "0",
        "memory": "0",
        "sharing-strategy": "",
    }
    # The whole-GPU labels underneath stay (GFD's merge replaces only the keys above).
    assert (gpu["family"], gpu["compute.major"], gpu["mode"]) == ("ampere", "8", "compute")


def test_machine_type_is_sanitised_as_gfd_sanitises_products() -> None:
    inventory = discovered("t4-single")
    for machine, label in [
        ("Standard PC (Q35 + ICH9, 2009)", "Standard-PC-Q35-ICH9-2009"),  # QEMU/KVM guests
        ("DGX A100 920-23687-2530-000", "DGX-A100-920-23687-2530-000"),
        ("PowerEdge R750xa", "PowerEdge-R750xa"),
        ("unknown", "unknown"),
    ]:
        settings = LabelSettings(machine_type=machine)
        assert node_labels(inventory, Config(), settings=settings)[N + "gpu.machine"] == label


def test_a_gpu_lost_at_start_keeps_the_model_labels_from_the_gpus_that_can_be_read() -> None:
    whole = gpu_keys(node_labels(discovered("dgx-a100"), Config()))
    for call in ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPciInfo", "nvmlDeviceGetCudaComputeCapability"):
        for gpu in (0, 7):  # the first GPU (we used to label from it) and the last (GFD's model GPU)
            inventory = discovered("dgx-a100", lose=(call, gpu))
            assert [g.index for g in inventory.gpus if g.lost] == [gpu], (call, gpu)
            labels = gpu_keys(node_labels(inventory, Config()))
            assert labels == whole, (call, gpu)  # family, memory, compute.*, mode, count: all kept


def test_a_lost_gpu_of_another_class_has_no_say_in_the_mode() -> None:
    node = {"gpus": [{**A100, "pci_class": "0x030000"}, A100, A100]}
    inventory = discovered(node, lose=("nvmlDeviceGetMemoryInfo", 0))
    assert node_labels(inventory, Config())[N + "gpu.mode"] == "compute"

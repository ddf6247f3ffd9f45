"""Labels of each simulated preset and sharing config, against GFD's documented rules.

Expected values are written from GFD's semantics (docs/labels.md), from the node files' facts (model names,
memory, driver), not from our own output.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nvidia_device_plugin.config.loader import load_config_file, parse_config_text
from nvidia_device_plugin.config.v1 import Config, Flags
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.labels import LabelSettings, node_labels
from nvidia_device_plugin.labels.gfd import arch_family, sanitise, version_labels
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.nvml.sim.node import load_node, preset_names

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
N = "nvidia.com/"
OURS = "nvdp.nvidia.com/"
PRESETS = preset_names()


def inventory_of(node: str) -> Inventory:
    session = open_nvml(node)
    try:
        return discover(session.nv, session.host.sysfs_root, session.host.proc_root)
    finally:
        session.close()


def labels_of(node: str, config: Config | None = None, **kw: object) -> dict[str, str]:
    return node_labels(inventory_of(node), config or Config(), **kw)  # type: ignore[arg-type]


def mig(strategy: str) -> Config:
    return Config(flags=Flags(mig_strategy=strategy))  # type: ignore[arg-type]


def test_dgx_a100_whole_gpus_exactly() -> None:
    labels = labels_of("dgx-a100", settings=LabelSettings(machine_type="DGX A100 920-23687-2530-000"))
    assert labels == {
        N + "gpu.machine": "DGX-A100-920-23687-2530-000",
        N + "cuda.driver.major": "550",
        N + "cuda.driver.minor": "54",
        N + "cuda.driver.rev": "15",
        N + "cuda.driver-version.major": "550",
        N + "cuda.driver-version.minor": "54",
        N + "cuda.driver-version.revision": "15",
        N + "cuda.driver-version.full": "550.54.15",
        N + "cuda.runtime.major": "12",
        N + "cuda.runtime.minor": "4",
        N + "cuda.runtime-version.major": "12",
        N + "cuda.runtime-version.minor": "4",
        N + "cuda.runtime-version.full": "12.4",
        N + "mig.capable": "true",
        N + "mps.capable": "false",
        N + "gpu.product": "NVIDIA-A100-SXM4-80GB",
        N + "gpu.count": "8",
        N + "gpu.replicas": "1",
        N + "gpu.sharing-strategy": "none",
        N + "gpu.memory": "81920",
        N + "gpu.family": "ampere",
        N + "gpu.compute.major": "8",
        N + "gpu.compute.minor": "0",
        N + "gpu.mode": "compute",
        N + "vgpu.present": "false",  # GFD v0.20 says so on every node without vGPUs
        OURS + "gpu.healthy": "8",
        OURS + "nvswitch": "true",
        OURS + "nvlink.fully-connected": "true",
        OURS + "nvlink.domain-size": "8",
        OURS + "numa.nodes": "2",
        OURS + "numa.gpus-per-node": "4-4",
    }


@pytest.mark.parametrize(
    ("node", "product", "count", "memory", "family", "major", "minor"),
    [
        ("dgx-h100", "NVIDIA-H100-80GB-HBM3", 8, 81559, "hopper", 9, 0),
        ("t4-single", "Tesla-T4", 1, 15360, "turing", 7, 5),
        ("pcie-nvlink-pairs", "NVIDIA-A100-PCIE-40GB", 4, 40960, "ampere", 8, 0),
        ("b200", "NVIDIA-B200", 8, 183359, "blackwell", 10, 0),
    ],
)
def test_model_labels_per_preset(
    node: str, product: str, count: int, memory: int, family: str, major: int, minor: int
) -> None:
    labels = labels_of(node)
    assert labels[N + "gpu.product"] == product
    assert labels[N + "gpu.count"] == str(count)
    assert labels[N + "gpu.memory"] == str(memory)
    assert (labels[N + "gpu.family"], labels[N + "gpu.compute.major"]) == (family, str(major))
    assert labels[N + "gpu.compute.minor"] == str(minor)
    assert N + "mig.strategy" not in labels  # GFD labels the strategy only for single and mixed


def test_t4_is_not_mig_capable_has_no_nvlink_and_unknown_numa() -> None:
    labels = labels_of("t4-single")
    assert labels[N + "mig.capable"] == "false"
    assert labels[N + "cuda.driver.rev"] == "08"  # GFD keeps the version's text: 535.161.08
    assert labels[N + "cuda.runtime-version.full"] == "12.2"
    assert labels[OURS + "nvswitch"] == "false"
    assert labels[OURS + "nvlink.domain-size"] == "1"
    assert OURS + "nvlink.fully-connected" not in labels  # one GPU: no pairs to judge
    assert OURS + "numa.nodes" not in labels  # sysfs says -1


def test_nvlink_pairs_are_not_fully_connected() -> None:
    labels = labels_of("pcie-nvlink-pairs")
    assert labels[OURS + "nvlink.fully-connected"] == "false"
    assert labels[OURS + "nvlink.domain-size"] == "2"
    assert labels[OURS + "nvswitch"] == "false"
    assert labels[OURS + "numa.gpus-per-node"] == "2-2"


def test_nps4_numa_layout() -> None:
    labels = labels_of("dgx-a100-nps4")
    assert labels[OURS + "numa.nodes"] == "8"
    assert labels[OURS + "numa.gpus-per-node"] == "1-1-1-1-1-1-1-1"


def test_time_slicing_marks_the_product_shared() -> None:
    labels = labels_of("dgx-a100", load_config_file(CONFIGS / "time-slicing.yaml"))
    replicas = load_config_file(CONFIGS / "time-slicing.yaml").sharing.time_slicing.resources[0].replicas
    assert labels[N + "gpu.product"] == "NVIDIA-A100-SXM4-80GB-SHARED"
    assert labels[N + "gpu.replicas"] == str(replicas)
    assert labels[N + "gpu.sharing-strategy"] == "time-slicing"
    assert labels[N + "mps.capable"] == "false"


def test_renamed_shared_resource_has_no_shared_suffix() -> None:
    for text in (
        "sharing: {timeSlicing: {renameByDefault: true, resources: [{name: nvidia.com/gpu, replicas: 3}]}}",
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, rename: a100, replicas: 3}]}}",
    ):
        labels = labels_of("dgx-a100", parse_config_text(text))
        assert labels[N + "gpu.product"] == "NVIDIA-A100-SXM4-80GB", text
        assert (labels[N + "gpu.replicas"], labels[N + "gpu.sharing-strategy"]) == ("3", "time-slicing")


def test_one_replica_is_not_shared() -> None:
    text = "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 1}]}}"
    labels = labels_of("dgx-a100", parse_config_text(text))
    assert labels[N + "gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert (labels[N + "gpu.replicas"], labels[N + "gpu.sharing-strategy"]) == ("1", "none")


def test_mps_sharing() -> None:
    config = load_config_file(CONFIGS / "mps.yaml")
    labels = labels_of("dgx-h100", config)
    assert labels[N + "gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert labels[N + "gpu.sharing-strategy"] == "mps"
    assert labels[N + "gpu.replicas"] == str(config.sharing.active.resources[0].replicas)
    assert labels[N + "mps.capable"] == "true"


def test_mps_is_not_capable_with_mig_enabled_gpus() -> None:
    config = parse_config_text("sharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}")
    assert labels_of("a100-mig-mixed", config)[N + "mps.capable"] == "false"


def test_mixed_strategy_per_profile_labels() -> None:
    labels = labels_of("a100-mig-mixed", mig("mixed"))
    assert labels[N + "mig.strategy"] == "mixed"
    # gpu.count counts every A100, the three in MIG mode too (GFD's rule); the whole one sets the rest.
    assert labels[N + "gpu.count"] == "4"
    assert labels[N + "gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels[N + "gpu.replicas"] == "1"
    # 7 + 2 devices of 1g.10gb, 1 + 2 of 3g.40gb, 1 of 2g.20gb (the preset's layouts).
    counts = {p: labels[f"{N}mig-{p}.count"] for p in ("1g.10gb", "2g.20gb", "3g.40gb")}
    assert counts == {"1g.10gb": "9", "2g.20gb": "1", "3g.40gb": "3"}
    assert labels[N + "mig-3g.40gb.product"] == "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"
    assert labels[N + "mig-3g.40gb.slices.gi"] == "3"
    assert labels[N + "mig-3g.40gb.slices.ci"] == "3"
    assert labels[N + "mig-1g.10gb.multiprocessors"] == "14"  # an A100 slice has 14 SMs
    assert labels[N + "mig-1g.10gb.engines.copy"] == "1"
    assert labels[N + "mig-1g.10gb.replicas"] == "1"
    assert labels[N + "mig-1g.10gb.sharing-strategy"] == "none"
    prefix = N + "mig-2g.20gb."
    suffixes = {k.removeprefix(prefix) for k in labels if k.startswith(prefix)}
    assert suffixes == {
        "count", "product", "replicas", "sharing-strategy", "memory", "multiprocessors", "slices.gi",
        "slices.ci", "engines.copy", "engines.decoder", "engines.encoder", "engines.jpeg", "engines.ofa",
    }  # fmt: skip


def test_mixed_strategy_time_slicing_a_mig_profile() -> None:
    text = (
        "flags: {migStrategy: mixed}\n"
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/mig-1g.10gb, replicas: 2}]}}"
    )
    labels = labels_of("a100-mig-mixed", parse_config_text(text))
    assert labels[N + "mig-1g.10gb.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED"
    assert labels[N + "mig-1g.10gb.replicas"] == "2"
    assert labels[N + "mig-1g.10gb.sharing-strategy"] == "time-slicing"
    assert labels[N + "mig-3g.40gb.product"] == "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"


def test_single_strategy_labels_the_mig_devices_as_gpus() -> None:
    labels = labels_of("a100-mig-single", mig("single"))
    assert labels[N + "mig.strategy"] == "single"
    assert labels[N + "gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    assert labels[N + "gpu.count"] == "14"
    assert labels[N + "gpu.replicas"] == "1"
    assert labels[N + "gpu.slices.gi"] == "1"
    assert labels[N + "gpu.family"] == "ampere"  # from the whole-GPU labels underneath
    assert not any(k.startswith(N + "mig-") for k in labels)


def test_single_strategy_on_a_mixed_layout_is_invalid() -> None:
    labels = labels_of("a100-mig-mixed", mig("single"))
    assert labels[N + "gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-INVALID"
    assert (labels[N + "gpu.count"], labels[N + "gpu.replicas"], labels[N + "gpu.memory"]) == ("0", "0", "0")


def test_none_strategy_on_mig_gpus_labels_whole_gpus_only() -> None:
    labels = labels_of("a100-mig-single")
    assert labels[N + "gpu.count"] == "2"
    # Every GPU is in MIG mode: their whole-GPU labels carry no sharing (GFD's rule).
    assert (labels[N + "gpu.replicas"], labels[N + "gpu.sharing-strategy"]) == ("0", "none")
    assert not any(k.startswith(N + "mig") and k != N + "mig.capable" for k in labels)


def test_plus_me_profile_is_named_as_nvidia_names_its_resource() -> None:
    # GFD v0.20 writes the "+" of 1g.18gb+me as ".", in keys and product (as in nvidia.com/mig-1g.18gb.me).
    labels = labels_of("h200-mig", mig("mixed"))
    assert labels[N + "mig-1g.18gb.me.product"] == "NVIDIA-H200-MIG-1g.18gb.me"
    assert labels[N + "mig-1g.18gb.me.count"] == "1"
    assert labels[N + "mig-1g.18gb.me.engines.ofa"] == "1"
    assert not any("+" in key for key in labels)
    assert labels[N + "gpu.family"] == "hopper"


def test_mixed_model_node_labels_the_model_discovered_last() -> None:
    # NVIDIA labels the model discovered last: H100 (GPUs 2 and 3) on the A100+H100 preset.
    labels = labels_of("mixed-a100-h100")
    assert labels[N + "gpu.product"] == "NVIDIA-H100-PCIe"
    assert labels[N + "gpu.count"] == "2"
    assert (labels[N + "gpu.memory"], labels[N + "gpu.family"]) == ("81559", "hopper")


def test_unhealthy_and_lost_gpus_lower_the_healthy_count() -> None:
    inventory = inventory_of("dgx-a100")
    unhealthy = {inventory.gpus[3].uuid, "MIG-not-a-whole-gpu"}
    assert node_labels(inventory, Config(), unhealthy)[OURS + "gpu.healthy"] == "7"


def test_timestamp_and_no_timestamp() -> None:
    inventory = inventory_of("t4-single")
    assert node_labels(inventory, Config(), timestamp=1700000000)[N + "gfd.timestamp"] == "1700000000"
    quiet = node_labels(inventory, Config(), settings=LabelSettings(no_timestamp=True), timestamp=17)
    assert N + "gfd.timestamp" not in quiet


def test_node_without_gpus_has_no_labels() -> None:
    assert node_labels(Inventory(gpus=()), Config(), timestamp=1) == {N + "gfd.timestamp": "1"}


@pytest.mark.parametrize("node", PRESETS)
def test_every_label_is_valid_for_kubernetes(node: str) -> None:
    for strategy in ("none", "single", "mixed"):
        for key, value in labels_of(node, mig(strategy), timestamp=1).items():
            assert len(value) <= 63 and all(c.isalnum() or c in "-_." for c in value), (key, value)
            name = key.split("/", 1)[1]  # +me profiles too: GFD writes their "+" as "."
            assert len(name) <= 63 and all(c.isalnum() or c in "-_." for c in name), key


def test_gfd_rules_in_isolation() -> None:
    assert sanitise("NVIDIA  A100 (PCIe) 40GB+") == "NVIDIA-A100-PCIe-40GB"
    ccs = ((7, 0), (7, 5), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0), (13, 0), (11, 0), (4, 0))
    assert [arch_family(*cc) for cc in ccs] == [
        "volta", "turing", "ampere", "ada-lovelace", "hopper", "blackwell", "blackwell", "rubin",
        "undefined", "undefined",
    ]  # fmt: skip
    assert version_labels("550.54", None)[N + "cuda.driver.rev"] == ""
    assert version_labels("bogus", None) == {}
    assert version_labels("", (12, 4))[N + "cuda.runtime-version.full"] == "12.4"


def test_compute_capability_not_supported_drops_architecture_labels(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(
        "gpus: [{name: Mystery GPU, memory_mib: 1024, compute_capability: null, pci_class: '0x030000'}]"
    )
    labels = labels_of(str(node))
    assert labels[N + "gpu.product"] == "Mystery-GPU"
    assert labels[N + "gpu.mode"] == "graphics"
    assert not any(k.startswith(N + "gpu.compute") or k == N + "gpu.family" for k in labels)
    assert load_node(str(node)).gpus[0].compute_capability is None

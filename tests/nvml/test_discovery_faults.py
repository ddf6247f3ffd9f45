"""Discovery degrades per GPU and per call: every call x every error code has a graceful outcome."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.pci import read_numa_node, sysfs_pci_name
from nvidia_device_plugin.nvml.sim.node import load_node, parse_node
from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml

CODES = {
    "NOT_SUPPORTED": pynvml.NVML_ERROR_NOT_SUPPORTED,
    "NO_PERMISSION": pynvml.NVML_ERROR_NO_PERMISSION,
    "INVALID_ARGUMENT": pynvml.NVML_ERROR_INVALID_ARGUMENT,
    "UNKNOWN": pynvml.NVML_ERROR_UNKNOWN,
    "GPU_IS_LOST": pynvml.NVML_ERROR_GPU_IS_LOST,
}
# Discovery's calls, and the GPU whose handle they are called on: GPU 0 holds the MIG devices.
GPU_CALLS = {
    "nvmlDeviceGetHandleByIndex": 1,
    "nvmlDeviceGetUUID": 1,
    "nvmlDeviceGetName": 1,
    "nvmlDeviceGetMinorNumber": 1,
    "nvmlDeviceGetMemoryInfo": 1,
    "nvmlDeviceGetPciInfo": 1,
    "nvmlDeviceGetNumaNodeId": 1,
    "nvmlDeviceGetMigMode": 0,
    "nvmlDeviceGetMaxMigDeviceCount": 0,
    "nvmlDeviceGetMigDeviceHandleByIndex": 0,
    "nvmlDeviceGetAttributes": 0,
    "nvmlDeviceGetGpuInstanceId": 0,
    "nvmlDeviceGetComputeInstanceId": 0,
    "nvmlDeviceGetGpuInstanceById": 0,
    "nvmlDeviceGetGpuInstanceProfileInfo": 0,
    "nvmlDeviceGetNvLinkState": 1,
    "nvmlDeviceGetNvLinkRemotePciInfo": 1,
    "nvmlDeviceGetNvLinkRemoteDeviceType": 1,
    "nvmlDeviceGetTopologyCommonAncestor": 1,
    "nvmlDeviceGetGpuFabricInfo": 1,
}
NODE_CALLS = ["nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion", "nvmlGpuInstanceGetInfo"]
# Losing these leaves nothing to advertise the GPU by (its handle, UUID, /dev minor, MIG mode).
ESSENTIAL = {"nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetMinorNumber"}

NODE = {
    "name": "faults",
    "gpus": [
        {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "numa_node": 0, "mig": ["3g.40gb", "1g.10gb"]},
        {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "numa_node": 0},
        {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "numa_node": 1},
    ],
    "nvlinks": [[1, 2, 12]],
}


@pytest.fixture
def sim() -> Iterator[SimulatedNvml]:
    sim = SimulatedNvml(parse_node(NODE, "test"))
    sim.nvmlInit()
    yield sim
    sim.close()


@pytest.fixture(scope="module")
def shared_host() -> Iterator[tuple[Path, Path]]:
    """NODE's host tree made once for the module (making one per case cost most of the matrix's time):
    an empty sysfs, and the proc root the simulator wrote."""
    owner = SimulatedNvml(parse_node(NODE, "test"))
    proc_root = owner.materialize_host().proc_root
    yield proc_root.parent / "no-sysfs", proc_root
    owner.close()


def _discover_on(sim: SimulatedNvml, host: tuple[Path, Path]) -> Inventory:
    return discover(sim, host[0], host[1])


def _discover(sim: SimulatedNvml, tmp_path: Path) -> Inventory:
    # An empty sysfs makes discovery fall back to nvmlDeviceGetNumaNodeId.
    return discover(sim, tmp_path / "no-sysfs", sim.materialize_host().proc_root)


@pytest.mark.parametrize("code_name", list(CODES))
@pytest.mark.parametrize("call", list(GPU_CALLS))
def test_a_failing_gpu_call_degrades_that_gpu_only(
    sim: SimulatedNvml, shared_host: tuple[Path, Path], call: str, code_name: str
) -> None:
    healthy = _discover_on(sim, shared_host)
    target = GPU_CALLS[call]
    sim.fail_always(call, CODES[code_name], gpu=target)
    inventory = _discover_on(sim, shared_host)
    others = [g for g in healthy.gpus if g.index != target]
    for gpu in others:
        found = next(g for g in inventory.gpus if g.index == gpu.index)
        assert not found.lost and found.uuid == gpu.uuid and found.minor == gpu.minor
    failing = next((g for g in inventory.gpus if g.index == target), None)
    if failing is None:
        assert call in ESSENTIAL | {"nvmlDeviceGetMigMode"}, f"GPU {target} dropped for {call}"
        assert any(p.gpu_index == target for p in inventory.problems)
    elif code_name == "GPU_IS_LOST" and call not in {"nvmlDeviceGetGpuInstanceProfileInfo"}:
        assert failing.lost, f"GPU_IS_LOST from {call} must serve GPU {target} as lost"
        assert any("advertised as Unhealthy" in p.message for p in inventory.problems)
    else:
        assert not failing.lost


@pytest.mark.parametrize("code_name", list(CODES))
@pytest.mark.parametrize("call", NODE_CALLS)
def test_a_failing_node_call_leaves_every_gpu_served(
    sim: SimulatedNvml, shared_host: tuple[Path, Path], call: str, code_name: str
) -> None:
    sim.fail_always(call, CODES[code_name])
    inventory = _discover_on(sim, shared_host)
    lost_mig_gpu = call == "nvmlGpuInstanceGetInfo" and code_name == "GPU_IS_LOST"  # GPU 0's instance
    assert [g.index for g in inventory.gpus if not g.lost] == ([1, 2] if lost_mig_gpu else [0, 1, 2])
    assert len(inventory.gpus) == 3


def test_gpu_lost_at_start_up_from_memory_is_served_lost_and_named(
    sim: SimulatedNvml, tmp_path: Path
) -> None:
    sim.fail_always("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST, gpu=1)
    inventory = _discover(sim, tmp_path)
    assert [(g.index, g.lost) for g in inventory.gpus] == [(0, False), (1, True), (2, False)]
    assert any(
        p.gpu_index == 1 and "GPU_IS_LOST from nvmlDeviceGetMemoryInfo" in p.message
        for p in inventory.problems
    )


def test_topology_not_supported_or_unknown_is_not_fatal(sim: SimulatedNvml, tmp_path: Path) -> None:
    for code in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_UNKNOWN):
        sim.clear_failures()
        sim.fail_always("nvmlDeviceGetTopologyCommonAncestor", code)
        inventory = _discover(sim, tmp_path)
        assert len(inventory.gpus) == 3
        link = inventory.link(1, 2)
        assert link is not None and link.nvlinks == 12  # NVLink still read


def test_one_bad_nvlink_is_skipped_and_the_rest_read(sim: SimulatedNvml, tmp_path: Path) -> None:
    sim.fail_next("nvmlDeviceGetNvLinkState", pynvml.NVML_ERROR_NOT_SUPPORTED)  # GPU 1's link 0
    inventory = _discover(sim, tmp_path)
    link = inventory.link(1, 2)
    assert link is not None and link.nvlinks == 12  # GPU 2 sees all 12; GPU 1 sees 11


def test_mig_index_gaps_and_invalid_argument_slots_are_skipped(tmp_path: Path) -> None:
    doc = {
        "gpus": [
            {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "mig": [None, "1g.10gb", None, "2g.20gb"]}
        ]
    }
    sim = SimulatedNvml(parse_node(doc, "gaps"))
    sim.nvmlInit()
    inventory = _discover(sim, tmp_path)
    assert [(m.index, m.profile) for m in inventory.gpus[0].mig_devices] == [(1, "1g.10gb"), (3, "2g.20gb")]
    assert inventory.problems == ()
    sim.close()


def test_dgx_display_is_not_a_compute_gpu(tmp_path: Path) -> None:
    doc = {
        "gpus": [
            {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920},
            {"name": "DGX Display", "memory_mib": 4096},
            {"name": "NVIDIA DGX Display", "memory_mib": 4096},
        ]
    }
    sim = SimulatedNvml(parse_node(doc, "station"))
    sim.nvmlInit()
    assert [g.name for g in _discover(sim, tmp_path).gpus] == ["NVIDIA A100-SXM4-80GB"]
    sim.close()


def test_numa_path_uses_the_kernel_domain_format_and_falls_back_to_nvml(tmp_path: Path) -> None:
    assert sysfs_pci_name("00010000:01:00.0") == "10000:01:00.0"
    assert sysfs_pci_name("00000000:07:00.0") == "0000:07:00.0"
    for name, node in (("10000:01:00.0", 3), ("0000:01:00.0", 0)):  # a VMD domain and the device it hid
        (tmp_path / "bus/pci/devices" / name).mkdir(parents=True)
        (tmp_path / "bus/pci/devices" / name / "numa_node").write_text(f"{node}\n")
    assert read_numa_node("00010000:01:00.0", tmp_path) == 3
    sim = SimulatedNvml(load_node("dgx-a100"))
    sim.nvmlInit()
    inventory = discover(sim, tmp_path / "empty")  # no sysfs: nvmlDeviceGetNumaNodeId answers
    assert [g.numa_node for g in inventory.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    sim.close()


def test_unprivileged_container_names_cap_sys_admin_and_serves_the_gpu(tmp_path: Path) -> None:
    doc = {
        "unprivileged_container": True,
        "gpus": [{"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "mig": ["1g.10gb"]}],
    }
    sim = SimulatedNvml(parse_node(doc, "container"))
    sim.nvmlInit()
    inventory = _discover(sim, tmp_path)
    assert inventory.gpus[0].mig_enabled and inventory.gpus[0].mig_devices == ()
    assert any("CAP_SYS_ADMIN" in p.message for p in inventory.problems)
    sim.close()


def test_caps_minors_resolve_at_discovery_from_mig_minors_with_minors_unlike_indices(tmp_path: Path) -> None:
    doc = {
        "gpus": [
            {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "minor": 5, "mig": ["1g.10gb", "1g.10gb"]}
        ]
    }
    sim = SimulatedNvml(parse_node(doc, "minors"))
    sim.nvmlInit()
    host = sim.materialize_host()
    inventory = discover(sim, host.sysfs_root, host.proc_root)
    gpu = inventory.gpus[0]
    assert gpu.minor == 5
    text = (host.proc_root / "driver/nvidia-caps/mig-minors").read_text()
    for mig in gpu.mig_devices:
        gi, ci = mig.gpu_instance_id, mig.compute_instance_id
        assert mig.caps_minors is not None
        assert f"gpu5/gi{gi}/access {mig.caps_minors[0]}\n" in text
        assert f"gpu5/gi{gi}/ci{ci}/access {mig.caps_minors[1]}\n" in text
    sim.close()


def test_caps_minors_fall_back_to_the_capabilities_tree(tmp_path: Path) -> None:
    access = tmp_path / "driver/nvidia/capabilities/gpu0/mig/gi1"
    (access / "ci0").mkdir(parents=True)
    (access / "access").write_text("DeviceFileMinor: 12\nDeviceFileMode: 292\n")
    (access / "ci0" / "access").write_text("DeviceFileMinor: 13\nDeviceFileMode: 292\n")
    from nvidia_device_plugin.nvml.mig_profiles import read_mig_minors, resolve_caps_minors

    assert read_mig_minors(tmp_path) == {}
    assert resolve_caps_minors({}, tmp_path, 0, 1, 0) == (12, 13)
    assert resolve_caps_minors({}, tmp_path, 0, 2, 0) is None


def test_a_gpu_lost_at_start_up_is_advertised_unhealthy_and_does_not_block_the_pipeline() -> None:
    from nvidia_device_plugin.config.v1 import Config
    from nvidia_device_plugin.health.registry import (
        REASON_LOST_AT_START_UP,
        HealthRegistry,
        mark_lost_at_start_up,
    )
    from nvidia_device_plugin.nvml.session import open_nvml
    from nvidia_device_plugin.snapshot import build_snapshot

    with open_nvml("dgx-a100") as session:
        assert session.simulator is not None
        session.simulator.fail_always(
            "nvmlDeviceGetTopologyCommonAncestor", pynvml.NVML_ERROR_GPU_IS_LOST, gpu=3
        )
        snapshot = build_snapshot(session, Config())  # what start and every reload run
        registry = HealthRegistry()
        mark_lost_at_start_up(registry, snapshot.inventory)
        (plan,) = snapshot.plans
        assert len(plan.devices) == 8
        unhealthy = [d.gpu_index for d in plan.devices if not registry.is_healthy(d)]
        assert unhealthy == [3]
        assert registry.reason(plan.devices[3]) == REASON_LOST_AT_START_UP

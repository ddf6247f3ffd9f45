"""NVLink fabric (nvidia.com/gpu.clique) and vGPU (nvidia.com/vgpu.*): the simulator answers as NVML and sysfs
do, discovery judges the answers as go-nvlib and GFD do, and the labels are GFD v0.20's.

GFD's rules (k8s-device-plugin internal/lm/imex.go, go-nvlib IsFabricAttached): a GPU is attached when
nvmlDeviceGetGpuFabricInfo succeeds with state COMPLETED, status SUCCESS and a cluster UUID that is not all
zero; NOT_SUPPORTED means not attached. The label is "<cluster UUID>.<clique ID>" when every attached GPU
agrees, absent otherwise. vgpu.present is "false" on a node whose GPUs carry no vGPU capability.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pynvml
import pytest

from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.devices import GpuFabric, Inventory, VgpuInfo
from nvidia_device_plugin.labels import node_labels
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.sim.node import load_node, parse_node
from nvidia_device_plugin.nvml.sim.pci_config import pci_config
from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml
from nvidia_device_plugin.nvml.vgpu import vgpu_of

N = "nvidia.com/"
GB200_CLUSTER = "7d6e3a52-1f0b-4c3e-9a1d-2b9f0c8e4d11"  # the gb200-nvl preset's
GB200 = {"name": "NVIDIA GB200", "memory_mib": 189471}


def discovered(doc: dict[str, Any] | str, fail: tuple[str, int, int] | None = None) -> Inventory:
    sim = SimulatedNvml(load_node(doc) if isinstance(doc, str) else parse_node(doc, "test"))
    sim.nvmlInit()
    if fail is not None:
        sim.fail_always(fail[0], fail[1], gpu=fail[2])
    try:
        host = sim.materialize_host()
        return discover(sim, host.sysfs_root, host.proc_root)
    finally:
        sim.close()


def labels(doc: dict[str, Any] | str, fail: tuple[str, int, int] | None = None) -> dict[str, str]:
    return node_labels(discovered(doc, fail), Config())


def fabric(cluster: str = GB200_CLUSTER, clique: int = 32766, **more: object) -> dict[str, object]:
    return {"cluster_uuid": cluster, "clique_id": clique, **more}


# ---- the simulator, at pynvml's boundary -------------------------------------------------------------


def test_fabric_info_fills_pynvmls_struct_through_a_pointer_and_answers_not_supported_without_one() -> None:
    sim = SimulatedNvml(parse_node({"fabric": fabric(), "gpus": [GB200, {**GB200, "fabric": None}]}, "t"))
    sim.nvmlInit()
    info = pynvml.c_nvmlGpuFabricInfo_t()
    gpu0 = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceGetGpuFabricInfo(gpu0, ctypes.byref(info)) == pynvml.NVML_SUCCESS
    assert bytes(info.clusterUuid).hex() == GB200_CLUSTER.replace("-", "")
    assert (info.cliqueId, info.state, info.status) == (32766, pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 0)
    pointed = pynvml.c_nvmlGpuFabricInfo_t()
    sim.nvmlDeviceGetGpuFabricInfo(gpu0, ctypes.pointer(pointed))
    assert pointed.cliqueId == 32766
    with pytest.raises(pynvml.NVMLError_NotSupported):  # GPU 1 sets `fabric: null`: on no fabric
        sim.nvmlDeviceGetGpuFabricInfo(sim.nvmlDeviceGetHandleByIndex(1), ctypes.byref(info))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # the struct itself is not a pointer to one
        sim.nvmlDeviceGetGpuFabricInfo(gpu0, info)
    sim.set_lost(0, True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetGpuFabricInfo(gpu0, ctypes.byref(info))


def test_gpus_of_presets_without_a_fabric_answer_not_supported() -> None:
    sim = SimulatedNvml(load_node("dgx-h100"))
    sim.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetGpuFabricInfo(
            sim.nvmlDeviceGetHandleByIndex(0), ctypes.byref(pynvml.c_nvmlGpuFabricInfo_t())
        )


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"clique_id": 1}, "must be a mapping with cluster_uuid and clique_id"),
        (fabric(cluster="not-a-uuid"), "cluster_uuid must be a UUID"),
        (fabric(state="done"), "state must be one of not_supported, not_started, in_progress, completed"),
        (fabric(colour="blue"), "unknown node field gpus\\[0\\].fabric.colour"),
    ],
)
def test_a_bad_fabric_in_a_node_file_is_refused_by_name(bad: dict[str, object], message: str) -> None:
    with pytest.raises(Exception, match=message):
        parse_node({"gpus": [{**GB200, "fabric": bad}]}, "node.yaml")


# ---- the clique label ---------------------------------------------------------------------------------


def test_gb200_tray_is_labelled_with_its_clique_as_gfd_writes_it() -> None:
    inventory = discovered("gb200-nvl")
    assert {g.fabric for g in inventory.gpus} == {GpuFabric(GB200_CLUSTER, 32766)}
    assert node_labels(inventory, Config())[N + "gpu.clique"] == f"{GB200_CLUSTER}.32766"


def test_clique_zero_is_a_clique() -> None:
    assert labels({"fabric": fabric(clique=0), "gpus": [GB200]})[N + "gpu.clique"] == f"{GB200_CLUSTER}.0"


@pytest.mark.parametrize(
    "node_fabric",
    [
        fabric(state="not_started"),
        fabric(state="in_progress"),
        fabric(status=pynvml.NVML_ERROR_UNKNOWN),  # the fabric manager failed this GPU
        fabric(cluster="00000000-0000-0000-0000-000000000000"),  # a local NVSwitch system, no fabric
        None,  # NOT_SUPPORTED
    ],
)
def test_gpus_not_attached_get_no_clique(node_fabric: dict[str, object] | None) -> None:
    inventory = discovered({"fabric": node_fabric, "gpus": [GB200, GB200]})
    assert [g.fabric for g in inventory.gpus] == [None, None]
    assert inventory.problems == ()  # not attached is not a problem
    assert N + "gpu.clique" not in node_labels(inventory, Config())


def test_gpus_that_disagree_on_the_clique_or_cluster_get_no_clique() -> None:
    other = "0b3f5c7e-9d1a-4e2b-8c6d-4f0a1b2c3d4e"
    assert N + "gpu.clique" not in labels(
        {"fabric": fabric(), "gpus": [GB200, {**GB200, "fabric": fabric(clique=9)}]}
    )
    assert N + "gpu.clique" not in labels(
        {"fabric": fabric(), "gpus": [GB200, {**GB200, "fabric": fabric(other)}]}
    )


def test_one_gpu_without_a_fabric_does_not_hide_the_others_clique() -> None:
    # As GFD: GPUs that are not attached are skipped, the attached ones decide.
    node = {"fabric": fabric(), "gpus": [GB200, {**GB200, "fabric": None}]}
    assert labels(node)[N + "gpu.clique"] == f"{GB200_CLUSTER}.32766"


def test_a_fabric_read_failing_leaves_the_clique_out_with_a_problem_and_serves_the_gpu() -> None:
    node = {"fabric": fabric(), "gpus": [GB200, GB200]}
    inventory = discovered(node, fail=("nvmlDeviceGetGpuFabricInfo", pynvml.NVML_ERROR_UNKNOWN, 1))
    assert [(g.lost, g.fabric is None) for g in inventory.gpus] == [(False, False), (False, True)]
    [problem] = [p for p in inventory.problems if p.call == "nvmlDeviceGetGpuFabricInfo"]
    assert problem.gpu_index == 1 and "gpu.clique label is left out" in problem.message
    # GPU 0 alone still says the clique (GFD would fail the whole pass and publish nothing).
    assert node_labels(inventory, Config())[N + "gpu.clique"] == f"{GB200_CLUSTER}.32766"


def test_a_driver_without_the_call_is_quietly_not_attached() -> None:
    node = {"fabric": fabric(), "gpus": [GB200]}
    inventory = discovered(node, fail=("nvmlDeviceGetGpuFabricInfo", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, 0))
    assert inventory.gpus[0].fabric is None and inventory.problems == ()


# ---- vGPU ---------------------------------------------------------------------------------------------


def test_non_vgpu_nodes_say_vgpu_present_false() -> None:
    for preset in ("dgx-a100", "t4-single", "gb200-nvl"):
        found = labels(preset)
        assert found[N + "vgpu.present"] == "false", preset
        assert not any(k.startswith(N + "vgpu.host") for k in found)


def test_a_vgpu_guest_says_present_with_the_host_driver() -> None:
    vgpu = {"host_driver_version": "550.54.16", "host_driver_branch": "r550_40"}
    inventory = discovered({"gpus": [{"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "vgpu": vgpu}]})
    assert inventory.gpus[0].vgpu == VgpuInfo("550.54.16", "r550_40")
    found = node_labels(inventory, Config())
    assert (found[N + "vgpu.present"], found[N + "vgpu.host-driver-version"]) == ("true", "550.54.16")
    assert found[N + "vgpu.host-driver-branch"] == "r550_40"


def test_an_unprivileged_container_cannot_say_so_and_leaves_vgpu_out() -> None:
    # The kernel serves 64 bytes of `config` without CAP_SYS_ADMIN: the capability list is out of reach.
    node = {"unprivileged_container": True, "gpus": [{"name": "Tesla T4", "memory_mib": 15360}]}
    inventory = discovered(node)
    assert (inventory.gpus[0].vgpu_checked, inventory.gpus[0].vgpu) == (False, None)
    assert not any(k.startswith(N + "vgpu.") for k in node_labels(inventory, Config()))


def test_vgpu_capability_parsing_as_gfd_reads_the_config_space() -> None:
    # NVIDIA's own example of a vGPU's vendor capability (internal/vgpu's test data): host driver 460.16,
    # branch r460_00, behind a capability list at 0x68.
    space = bytearray(256)
    space[0x06], space[0x34] = 0x10, 0x68
    capability = bytes([0x09, 0x00, 0x1B, 0x56, 0x46, 0x00, 0x16]) + b"460.16\0\0\0\0" + b"r460_00\0\0\0"
    space[0x68 : 0x68 + len(capability)] = capability
    assert vgpu_of(bytes(space)) == VgpuInfo("460.16", "r460_00")
    space[0x68 + 3] = ord("X")  # not the "VF" signature: a passthrough GPU's vendor capability
    assert vgpu_of(bytes(space)) is None
    space[0x06] = 0  # no capability list at all
    assert vgpu_of(bytes(space)) is None
    looped = bytearray(256)
    looped[0x06], looped[0x34], looped[0x40:0x43] = 0x10, 0x40, bytes([0x10, 0x40, 0x00])
    assert vgpu_of(bytes(looped)) is None  # a list pointing at itself ends


def test_simulated_config_space_is_read_back_as_written() -> None:
    [gpu] = parse_node(
        {"gpus": [{**GB200, "vgpu": {"host_driver_version": "1", "host_driver_branch": "b"}}]}, "t"
    ).gpus
    assert vgpu_of(pci_config(gpu)) == VgpuInfo("1", "b")
    assert len(pci_config(gpu, unprivileged=True)) == 64


def test_vgpu_in_a_node_file_must_name_both_fields(tmp_path: Path) -> None:
    with pytest.raises(
        Exception, match="vgpu must be a mapping of host_driver_branch and host_driver_version"
    ):
        parse_node({"gpus": [{**GB200, "vgpu": {"host_driver_version": "1"}}]}, str(tmp_path / "n.yaml"))

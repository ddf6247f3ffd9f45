"""Allocate responses: exact protobuf contents per strategy, device specs, MPS, and every refusal."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Container, Sequence
from dataclasses import MISSING, fields, replace
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToDict

from nvidia_device_plugin.api.v1beta1 import api_pb2
from nvidia_device_plugin.base.errors import AllocationError
from nvidia_device_plugin.config.v1 import Config, Flags, PluginFlags
from nvidia_device_plugin.devices import Gpu, Inventory, MigDevice
from nvidia_device_plugin.devnodes import mig_capability_device_node
from nvidia_device_plugin.health.registry import UnhealthyIds
from nvidia_device_plugin.nvml.host import HostPaths
from nvidia_device_plugin.plans.resources import AdvertisedDevice, ResourcePlan, replica_id
from nvidia_device_plugin.serving.allocate import (
    AllocationIndex,
    AllocationSettings,
    allocate,
)

from support.builders import gpu_device, mig_device

GOLDEN = Path(__file__).parent / "golden" / "allocate"
GIB = 1024**3

GPU0 = "GPU-0a0a0a0a-0000-4000-8000-000000000000"
GPU1 = "GPU-1b1b1b1b-1111-4111-8111-111111111111"
GPU2 = "GPU-2c2c2c2c-2222-4222-8222-222222222222"
MIG_A = "MIG-aaaaaaaa-2222-5222-8222-00000000000a"
MIG_B = "MIG-bbbbbbbb-2222-5222-8222-00000000000b"


def _inventory() -> Inventory:
    """GPUs 0 and 1 whole, GPU 2 in MIG mode with two 1g.10gb devices. Minors differ from indices."""
    migs = (
        MigDevice(MIG_A, 0, GPU2, 2, "1g.10gb", 10 * GIB, gpu_instance_id=7, compute_instance_id=0),
        MigDevice(MIG_B, 1, GPU2, 2, "1g.10gb", 10 * GIB, gpu_instance_id=8, compute_instance_id=0),
    )
    return Inventory(
        gpus=(
            Gpu(
                0,
                GPU0,
                "NVIDIA A100-SXM4-80GB",
                80 * GIB,
                "00000000:07:00.0",
                minor=4,
                numa_node=0,
                mig_enabled=False,
            ),
            Gpu(
                1,
                GPU1,
                "NVIDIA A100-SXM4-80GB",
                80 * GIB,
                "00000000:0F:00.0",
                minor=5,
                numa_node=0,
                mig_enabled=False,
            ),
            Gpu(
                2,
                GPU2,
                "NVIDIA A100-SXM4-80GB",
                80 * GIB,
                "00000000:47:00.0",
                minor=6,
                numa_node=1,
                mig_enabled=True,
                mig_devices=migs,
            ),
        )
    )


def _gpu(uuid: str, index: int, replica: int | None = None) -> AdvertisedDevice:
    return gpu_device(uuid, index, replica)


def _mig(uuid: str, mig_index: int) -> AdvertisedDevice:
    return mig_device(uuid, GPU2, 2, mig_index, numa=1)


WHOLE = ResourcePlan("nvidia.com/gpu", (_gpu(GPU0, 0), _gpu(GPU1, 1)))
REPLICAS = ResourcePlan(
    "nvidia.com/gpu.shared",
    tuple(_gpu(u, i, r) for i, u in enumerate((GPU0, GPU1)) for r in range(2)),
    sharing="time-slicing",
    replicas=2,
)
MIG = ResourcePlan("nvidia.com/mig-1g.10gb", (_mig(MIG_A, 0), _mig(MIG_B, 1)))
MPS = ResourcePlan(
    "nvidia.com/gpu",
    tuple(_gpu(u, i, r) for i, u in enumerate((GPU0, GPU1)) for r in range(4)),
    sharing="mps",
    replicas=4,
    fail_requests_greater_than_one=True,  # the loader's default for sharing.mps
)

# (plan, one container's request); the requests put devices out of plan order on purpose.
KINDS: dict[str, tuple[ResourcePlan, list[str]]] = {
    "whole-gpu": (WHOLE, [GPU1, GPU0]),
    "replica": (REPLICAS, [replica_id(GPU1, 0), replica_id(GPU0, 1), replica_id(GPU1, 1)]),
    "mig": (MIG, [MIG_B, MIG_A]),
    "mps-replica": (MPS, [replica_id(GPU1, 2)]),
}
STRATEGIES = [
    ("envvar",),
    ("volume-mounts",),
    ("cdi-annotations",),
    ("cdi-cri",),
    ("envvar", "cdi-annotations"),
    ("envvar", "volume-mounts"),
]


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A node where every control device node exists and GPU 2's MIG capabilities are readable."""
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
        (tmp_path / "dev").mkdir(exist_ok=True)
        (tmp_path / "dev" / name).touch()
    caps = tmp_path / "proc/driver/nvidia/capabilities/gpu6/mig"
    for gi, ci, gi_minor, ci_minor in ((7, 0, 75, 76), (8, 0, 84, 85)):
        (caps / f"gi{gi}" / f"ci{ci}").mkdir(parents=True)
        (caps / f"gi{gi}" / "access").write_text(f"DeviceFileMinor: {gi_minor}\nDeviceFileMode: 292\n")
        (caps / f"gi{gi}" / f"ci{ci}" / "access").write_text(
            f"DeviceFileMinor: {ci_minor}\nDeviceFileMode: 292\n"
        )
    return tmp_path


def _settings(node: Path | None = None, **overrides: object) -> AllocationSettings:
    roots: dict[str, object] = {}
    if node is not None:
        roots = {"proc_root": str(node / "proc"), "device_node_probe_root": str(node)}
    return replace(AllocationSettings.from_config(Config()), **{**roots, **overrides})  # type: ignore[arg-type]


def _allocate(
    plan: ResourcePlan,
    requests: Sequence[Sequence[str]],
    settings: AllocationSettings,
    down: Container[str] = frozenset(),
) -> api_pb2.AllocateResponse:
    """allocate() for `plan` on _inventory()'s node, with the devices (or their GPUs) in `down` unhealthy."""
    return allocate(AllocationIndex(plan, _inventory()), requests, settings, UnhealthyIds(down))


def _one(
    plan: ResourcePlan, ids: list[str], settings: AllocationSettings
) -> api_pb2.ContainerAllocateResponse:
    response = _allocate(plan, [ids], settings)
    assert len(response.container_responses) == 1
    return response.container_responses[0]


def _as_dict(message: api_pb2.ContainerAllocateResponse) -> dict[str, object]:
    return MessageToDict(message, preserving_proto_field_name=True)


# ----------------------------------------------------------------------------------------------------
# Golden responses: every kind x strategy x device-ID strategy, device specs on.


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_golden_responses(kind: str, node: Path) -> None:
    plan, ids = KINDS[kind]
    actual: dict[str, object] = {}
    for strategies in STRATEGIES:
        for id_strategy in ("uuid", "index"):
            settings = _settings(
                node,
                device_list_strategy=strategies,
                device_id_strategy=id_strategy,
                pass_device_specs=True,
                nvidia_dev_root="/run/nvidia/driver",
            )
            actual[f"{'+'.join(strategies)} {id_strategy}"] = _as_dict(_one(plan, ids, settings))
    path = GOLDEN / f"{kind}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(actual, indent=2, sort_keys=True) + "\n")
    assert actual == json.loads(path.read_text())


# ----------------------------------------------------------------------------------------------------
# The formats, spelled out by hand (independent of the golden files).


def test_envvar_lists_physical_uuids_in_request_order() -> None:
    response = _one(WHOLE, [GPU1, GPU0], _settings())
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{GPU1},{GPU0}"}
    assert (
        not response.mounts and not response.devices and not response.annotations and not response.cdi_devices
    )


def test_replicas_map_back_to_their_gpus_once_each() -> None:
    ids = [replica_id(GPU1, 0), replica_id(GPU0, 1), replica_id(GPU1, 1)]
    assert dict(_one(REPLICAS, ids, _settings()).envs) == {"NVIDIA_VISIBLE_DEVICES": f"{GPU1},{GPU0}"}
    index = _settings(device_id_strategy="index")
    assert dict(_one(REPLICAS, ids, index).envs) == {"NVIDIA_VISIBLE_DEVICES": "1,0"}


def test_index_strategy_names_mig_devices_gpu_colon_mig() -> None:
    response = _one(MIG, [MIG_B, MIG_A], _settings(device_id_strategy="index"))
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": "2:1,2:0"}


def test_volume_mounts_point_dev_null_at_one_path_per_device() -> None:
    response = _one(MIG, [MIG_A], _settings(device_list_strategy=("volume-mounts",)))
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert list(response.mounts) == [
        api_pb2.Mount(container_path=f"/var/run/nvidia-container-devices/{MIG_A}", host_path="/dev/null")
    ]


def test_volume_mounts_win_over_envvar_for_the_variable() -> None:
    response = _one(WHOLE, [GPU0], _settings(device_list_strategy=("envvar", "volume-mounts")))
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert [m.container_path for m in response.mounts] == [f"/var/run/nvidia-container-devices/{GPU0}"]


def test_cdi_annotations_follow_the_cdi_library_key_format_and_leave_the_envvar_unset() -> None:
    response = _one(WHOLE, [GPU1, GPU0], _settings(device_list_strategy=("cdi-annotations",)))
    assert not response.envs
    ((key, value),) = response.annotations.items()
    match = re.fullmatch(r"cdi\.k8s\.io/(nvidia-device-plugin_[0-9a-f-]{36})", key)
    assert match is not None and len(match.group(1)) <= 63
    assert value == f"k8s.device-plugin.nvidia.com/gpu={GPU1},k8s.device-plugin.nvidia.com/gpu={GPU0}"


def test_cdi_annotation_key_is_stable_per_request_and_differs_between_resources() -> None:
    settings = _settings(device_list_strategy=("cdi-annotations",))
    first = _one(WHOLE, [GPU0], settings).annotations
    again = _one(WHOLE, [GPU0], settings).annotations
    other = _one(REPLICAS, [replica_id(GPU0, 0)], settings).annotations
    assert first == again
    assert set(first).isdisjoint(other)


def test_custom_cdi_annotation_prefix_replaces_the_default() -> None:
    settings = _settings(device_list_strategy=("cdi-annotations",), cdi_annotation_prefix="example.com/cdi.")
    (key,) = _one(WHOLE, [GPU0], settings).annotations
    assert key.startswith("example.com/cdi.nvidia-device-plugin_")


def test_cdi_cri_names_devices_in_the_response_with_mig_index_ids() -> None:
    settings = _settings(device_list_strategy=("cdi-cri",), device_id_strategy="index")
    response = _one(MIG, [MIG_B], settings)
    assert list(response.cdi_devices) == [api_pb2.CDIDevice(name="k8s.device-plugin.nvidia.com/gpu=2:1")]
    assert not response.envs and not response.annotations


def test_envvar_with_cdi_annotations_gives_both() -> None:
    response = _one(WHOLE, [GPU0], _settings(device_list_strategy=("envvar", "cdi-annotations")))
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": GPU0}
    assert list(response.annotations.values()) == [f"k8s.device-plugin.nvidia.com/gpu={GPU0}"]


def test_gdrcopy_gds_and_mofed_add_envs_and_cdi_devices() -> None:
    settings = _settings(
        device_list_strategy=("envvar", "cdi-cri"), gdrcopy_enabled=True, gds_enabled=True, mofed_enabled=True
    )
    response = _one(WHOLE, [GPU0], settings)
    assert dict(response.envs) == {
        "NVIDIA_VISIBLE_DEVICES": GPU0,
        "NVIDIA_GDRCOPY": "enabled",
        "NVIDIA_GDS": "enabled",
        "NVIDIA_MOFED": "enabled",
    }
    assert [d.name for d in response.cdi_devices] == [
        f"k8s.device-plugin.nvidia.com/gpu={GPU0}",
        "k8s.device-plugin.nvidia.com/gdrcopy=all",
        "k8s.device-plugin.nvidia.com/gds=all",
        "k8s.device-plugin.nvidia.com/mofed=all",
    ]


def test_mps_replica_gets_pipe_log_shm_and_its_share_of_the_gpu() -> None:
    response = _one(MPS, [replica_id(GPU1, 2)], _settings(mps_root="/run/nvidia/mps"))
    assert dict(response.envs) == {
        "NVIDIA_VISIBLE_DEVICES": GPU1,
        "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe",
        "CUDA_MPS_LOG_DIRECTORY": "/mps/nvidia.com/gpu/log",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",  # 80 GiB / 4 replicas
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }
    assert list(response.mounts) == [
        api_pb2.Mount(
            container_path="/mps/nvidia.com/gpu/pipe", host_path=f"/run/nvidia/mps/nvidia.com/gpu/{GPU1}/pipe"
        ),
        api_pb2.Mount(
            container_path="/mps/nvidia.com/gpu/log",
            host_path=f"/run/nvidia/mps/nvidia.com/gpu/{GPU1}/log",
            read_only=True,
        ),
        api_pb2.Mount(container_path="/dev/shm", host_path="/run/nvidia/mps/shm"),
    ]


def test_mps_edits_are_given_under_cdi_only_strategies_too() -> None:
    response = _one(MPS, [replica_id(GPU0, 0)], _settings(device_list_strategy=("cdi-cri",)))
    assert "NVIDIA_VISIBLE_DEVICES" not in response.envs
    assert response.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
    assert [m.container_path for m in response.mounts][-1] == "/dev/shm"


def test_an_unshared_gpu_in_an_mps_resource_gets_no_mps_edits() -> None:
    plan = ResourcePlan("nvidia.com/gpu", (_gpu(GPU0, 0), *MPS.devices[4:]), sharing="mps", replicas=4)
    response = _one(plan, [GPU0], _settings())
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": GPU0}
    assert not response.mounts


def test_every_container_is_answered_on_its_own_in_order() -> None:
    response = _allocate(WHOLE, [[GPU1], [GPU0]], _settings())
    assert [c.envs["NVIDIA_VISIBLE_DEVICES"] for c in response.container_responses] == [GPU1, GPU0]
    assert _allocate(WHOLE, [], _settings()) == api_pb2.AllocateResponse()


# ----------------------------------------------------------------------------------------------------
# Device specs


def test_device_specs_for_a_gpu_use_its_minor_under_the_dev_root(node: Path) -> None:
    settings = _settings(node, pass_device_specs=True, nvidia_dev_root="/run/nvidia/driver")
    specs = [(d.container_path, d.host_path, d.permissions) for d in _one(WHOLE, [GPU1], settings).devices]
    assert specs == [
        ("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", "/run/nvidia/driver/dev/nvidia-uvm", "rw"),
        ("/dev/nvidia-uvm-tools", "/run/nvidia/driver/dev/nvidia-uvm-tools", "rw"),
        ("/dev/nvidia-modeset", "/run/nvidia/driver/dev/nvidia-modeset", "rw"),
        ("/dev/nvidia5", "/run/nvidia/driver/dev/nvidia5", "rw"),
    ]


def test_device_specs_skip_control_nodes_the_node_lacks(node: Path) -> None:
    (node / "dev" / "nvidia-modeset").unlink()
    (node / "dev" / "nvidia-uvm-tools").unlink()
    settings = _settings(node, pass_device_specs=True)
    paths = [(d.container_path, d.host_path) for d in _one(WHOLE, [GPU0, GPU1], settings).devices]
    assert paths == [
        ("/dev/nvidiactl", "/dev/nvidiactl"),
        ("/dev/nvidia-uvm", "/dev/nvidia-uvm"),
        ("/dev/nvidia4", "/dev/nvidia4"),
        ("/dev/nvidia5", "/dev/nvidia5"),
    ]


def test_device_specs_for_mig_add_the_instance_capability_nodes_once_per_gpu(node: Path) -> None:
    settings = _settings(node, pass_device_specs=True)
    paths = [d.container_path for d in _one(MIG, [MIG_B, MIG_A], settings).devices]
    assert paths[4:] == [
        "/dev/nvidia6",
        "/dev/nvidia-caps/nvidia-cap84",
        "/dev/nvidia-caps/nvidia-cap85",
        "/dev/nvidia-caps/nvidia-cap75",
        "/dev/nvidia-caps/nvidia-cap76",
    ]


def test_device_specs_for_replicas_name_each_gpu_once(node: Path) -> None:
    ids = [replica_id(GPU0, 0), replica_id(GPU0, 1)]
    settings = _settings(node, pass_device_specs=True)
    assert [d.container_path for d in _one(REPLICAS, ids, settings).devices][4:] == ["/dev/nvidia4"]


def test_device_specs_are_not_passed_when_only_cdi_is_used(node: Path) -> None:
    settings = _settings(node, pass_device_specs=True, device_list_strategy=("cdi-annotations", "cdi-cri"))
    assert not _one(WHOLE, [GPU0], settings).devices


def test_missing_mig_capability_file_is_refused_naming_it(node: Path) -> None:
    missing = node / "proc/driver/nvidia/capabilities/gpu6/mig/gi8/ci0/access"
    missing.unlink()
    with pytest.raises(AllocationError, match=re.escape(str(missing))):
        _one(MIG, [MIG_B], _settings(node, pass_device_specs=True))


def test_capability_file_without_a_minor_is_refused(tmp_path: Path) -> None:
    access = tmp_path / "access"
    access.write_text("DeviceFileMode: 292\n")
    with pytest.raises(AllocationError, match=r"has no valid 'DeviceFileMinor: <N>' line"):
        mig_capability_device_node(str(access))
    access.write_text("DeviceFileMinor: 12\n")
    assert mig_capability_device_node(str(access)) == "/dev/nvidia-caps/nvidia-cap12"


def test_device_specs_need_the_inventory() -> None:
    without_gpus = AllocationIndex(WHOLE, Inventory(gpus=()))
    with pytest.raises(AllocationError, match=rf"minor number of GPU {GPU0}"):
        allocate(without_gpus, [[GPU0]], _settings(pass_device_specs=True), UnhealthyIds(frozenset()))


# ----------------------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize(
    ("plan", "ids", "message"),
    [
        (WHOLE, [], r"container_requests\[0\]: no device IDs requested for resource nvidia.com/gpu"),
        (WHOLE, ["GPU-nope"], r"unknown device ID 'GPU-nope' for resource nvidia.com/gpu"),
        (WHOLE, [GPU0, GPU0], rf"device ID '{GPU0}' is requested more than once"),
        (
            WHOLE,
            [GPU0, GPU1, GPU0],
            r"request for 'nvidia.com/gpu: 3' exceeds the 2 devices the resource has",
        ),
        (MIG, [GPU0], rf"unknown device ID '{GPU0}' for resource nvidia.com/mig-1g.10gb"),
        (
            MPS,
            [replica_id(GPU0, 0), replica_id(GPU1, 0)],
            r"request for 'nvidia.com/gpu: 2' too large: maximum request size for shared resources is 1",
        ),
    ],
)
def test_bad_requests_are_refused_naming_the_problem(
    plan: ResourcePlan, ids: list[str], message: str
) -> None:
    with pytest.raises(AllocationError, match=message):
        _allocate(plan, [ids], _settings())


def test_the_failing_container_is_named() -> None:
    with pytest.raises(AllocationError, match=r"^container_requests\[1\]: unknown device ID 'x'"):
        _allocate(WHOLE, [[GPU0], ["x"]], _settings())


def test_time_slicing_limits_requests_only_with_fail_requests_greater_than_one() -> None:
    ids = [replica_id(GPU0, 0), replica_id(GPU1, 0)]
    assert _allocate(REPLICAS, [ids], _settings()).container_responses
    strict = ResourcePlan(
        REPLICAS.name, REPLICAS.devices, "time-slicing", replicas=2, fail_requests_greater_than_one=True
    )
    with pytest.raises(AllocationError, match=r"'nvidia.com/gpu.shared: 2' too large"):
        _allocate(strict, [ids], _settings())
    assert _allocate(strict, [[ids[0]]], _settings()).container_responses


def test_an_unhealthy_replica_is_refused_and_its_siblings_are_not() -> None:
    down = [replica_id(GPU1, 1)]
    with pytest.raises(AllocationError, match=rf"container_requests\[0\]: device '{GPU1}::1' is unhealthy"):
        _allocate(REPLICAS, [[replica_id(GPU1, 1)]], _settings(), down=down)
    assert _allocate(REPLICAS, [[replica_id(GPU1, 0)]], _settings(), down=down).container_responses


def test_a_replica_of_an_unhealthy_gpu_is_refused() -> None:
    with pytest.raises(AllocationError, match=rf"device '{GPU1}::0' is unhealthy"):
        _allocate(REPLICAS, [[replica_id(GPU0, 0), replica_id(GPU1, 0)]], _settings(), down={GPU1})


def test_a_mig_device_on_an_unhealthy_gpu_is_refused() -> None:
    with pytest.raises(AllocationError, match=rf"device '{MIG_A}' is unhealthy"):
        _allocate(MIG, [[MIG_A]], _settings(), down={GPU2})
    assert _allocate(MIG, [[MIG_B]], _settings(), down={MIG_A}).container_responses


def test_unhealthy_may_be_any_collection_answering_in() -> None:
    class OnlyContains:
        """Answers `in` but cannot be listed cheaply, like a view over a health registry."""

        def __contains__(self, item: object) -> bool:
            return item == GPU1

        def __iter__(self):  # type: ignore[no-untyped-def]
            raise AssertionError("allocate must not list every unhealthy device")

        def __len__(self) -> int:
            raise AssertionError("allocate must not count every unhealthy device")

    with pytest.raises(AllocationError, match="is unhealthy"):
        _allocate(WHOLE, [[GPU1]], _settings(), down=OnlyContains())


def test_a_large_resource_allocates_a_full_request() -> None:
    devices = tuple(_gpu(f"GPU-{g:04d}", g, r) for g in range(8) for r in range(100))
    plan = ResourcePlan("nvidia.com/gpu", devices, sharing="time-slicing", replicas=100)
    index = AllocationIndex(plan, _inventory())
    ids = [d.id for d in reversed(devices)]
    response = allocate(index, [ids], _settings(), UnhealthyIds(frozenset()))
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(
        f"GPU-{g:04d}" for g in reversed(range(8))
    )


# ----------------------------------------------------------------------------------------------------
# Settings


def test_settings_from_config_take_the_plugin_flags() -> None:
    config = Config(
        flags=Flags(
            nvidia_driver_root="/run/nvidia/driver",
            nvidia_dev_root="/run/nvidia/driver",
            mps_root="/var/mps",
            gds_enabled=True,
            plugin=PluginFlags(
                pass_device_specs=True,
                device_list_strategy=("envvar", "cdi-cri"),
                device_id_strategy="index",
                cdi_annotation_prefix="x.io/",
            ),
        )
    )
    settings = AllocationSettings.from_config(config)
    assert settings == replace(
        AllocationSettings.from_config(Config()),
        device_list_strategy=("envvar", "cdi-cri"),
        device_id_strategy="index",
        pass_device_specs=True,
        nvidia_dev_root="/run/nvidia/driver",
        cdi_annotation_prefix="x.io/",
        mps_root="/var/mps",
        gds_enabled=True,
    )
    # No default of its own to drift from the config's: from_config is the one way to build the settings.
    assert [f.name for f in fields(AllocationSettings) if f.default is not MISSING] == []
    assert [f.name for f in fields(AllocationSettings) if f.default_factory is not MISSING] == []
    host = HostPaths(sysfs_root=Path("/s"), proc_root=Path("/p"), dev_root=Path("/d"))
    from_host = AllocationSettings.from_config(Config(), host)
    assert (from_host.proc_root, from_host.device_node_probe_root) == ("/p", "/d")

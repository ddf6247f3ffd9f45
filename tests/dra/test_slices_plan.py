"""`dra plan` and what it is made of: on every simulated preset and config the ResourceSlices and
DeviceClasses are schema-valid at Kubernetes 1.34-1.37, pass the API server's own limits, and carry the
attributes and classes NVIDIA's DRA driver and our config call for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from nvidia_device_plugin.config.dra import Dra
from nvidia_device_plugin.config.loader import parse_config_text
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.devices import Gpu
from nvidia_device_plugin.dra.dryrun import DryRun, dry_run
from nvidia_device_plugin.dra.slices import chunk_devices
from nvidia_device_plugin.dra.values import quantity, semver
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.nvml.sim.node import preset_names
from nvidia_device_plugin.snapshot import build_snapshot

from support.dra_rules import validate_objects

CONFIGS = {
    "default": "version: v1\n",
    "mixed": "version: v1\nflags: {migStrategy: mixed}\n",
    "single": "version: v1\nflags: {migStrategy: single}\n",
    "time-slicing": "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
    "    resources: [{name: nvidia.com/gpu, replicas: 4}]\n",
    "time-slicing-in-place": "version: v1\nsharing:\n  timeSlicing:\n"
    "    resources: [{name: nvidia.com/gpu, replicas: 4}]\n",
    "mps": "version: v1\nsharing:\n  mps:\n    resources: [{name: nvidia.com/gpu, replicas: 4}]\n",
    "renamed": "version: v1\nflags: {resourceNaming: true}\n"  # v0.20 ignores renames without it
    'resources:\n  gpus: [{pattern: "*H100*", name: h100}]\n',
}


def plan(preset: str, text: str = "version: v1\n", dra: str = "dra: {enabled: true}") -> DryRun:
    config = parse_config_text(text + dra + "\n")
    session = open_nvml(preset)
    try:
        return dry_run(build_snapshot(session, config), "gpu-node-1")
    finally:
        session.close()


def devices(result: DryRun) -> list[dict[str, Any]]:
    return [d for s in result.slices for d in s["spec"]["devices"]]


def attribute(device: dict[str, Any], name: str) -> object:
    (value,) = device["attributes"][name].values()
    return value


@pytest.mark.parametrize("preset", preset_names())
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_object_is_valid_at_every_supported_kubernetes_version(preset: str, config: str) -> None:
    try:
        result = plan(preset, CONFIGS[config])
    except Exception as exc:  # a config this node cannot serve (single on mixed MIG): refused, not planned
        pytest.skip(f"{config} does not apply to {preset}: {exc}")
    assert validate_objects([*result.slices, *result.classes]) == len(result.slices) + len(result.classes)


def test_whole_gpus_carry_nvidias_attributes_and_ours() -> None:
    result = plan("dgx-a100")
    gpu0 = devices(result)[0]
    assert gpu0["name"] == "gpu-0"
    assert {k: attribute(gpu0, k) for k in gpu0["attributes"] if k != "uuid"} == {
        "type": "gpu",
        "productName": "NVIDIA A100-SXM4-80GB",
        "brand": "Nvidia",
        "architecture": "Ampere",
        "cudaComputeCapability": "8.0.0",
        "driverVersion": "550.54.15",
        "cudaDriverVersion": "12.4.0",
        "resource.kubernetes.io/pciBusID": "0000:07:00.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:00",
        "resource.kubernetes.io/numaNode": 0,
        "nvlinkDomain": "nvlink-0",  # NVSwitch: one domain for all eight
        "pcieSwitch": "pcie-0",  # GPUs 0 and 1 share a switch
        "resourceName": "nvidia.com/gpu",
        "sharing": "none",
    }
    assert gpu0["capacity"] == {"memory": {"value": "80Gi"}}
    assert [attribute(d, "pcieSwitch") for d in devices(result)] == [f"pcie-{2 * (i // 2)}" for i in range(8)]
    assert "index" not in gpu0["attributes"] and "allowMultipleAllocations" not in gpu0


def test_static_mig_devices_are_named_by_profile_and_placement_with_their_parents_attributes() -> None:
    result = plan("a100-mig-mixed", CONFIGS["mixed"])
    by_name = {d["name"]: d for d in devices(result)}
    # GPU 1: 3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb placed at 4, 0, 2, 3 (NVIDIA's profile IDs 9, 14, 19)
    assert [n for n in by_name if n.startswith("gpu-1-")] == [
        "gpu-1-mig-3g40gb-9-4",
        "gpu-1-mig-2g20gb-14-0",
        "gpu-1-mig-1g10gb-19-2",
        "gpu-1-mig-1g10gb-19-3",
    ]
    mig = by_name["gpu-1-mig-3g40gb-9-4"]
    assert attribute(mig, "type") == "mig" and attribute(mig, "profile") == "3g.40gb"
    assert attribute(mig, "parentUUID") == attribute(by_name["gpu-1-mig-1g10gb-19-2"], "parentUUID")
    assert str(attribute(mig, "uuid")).startswith("MIG-")
    assert attribute(mig, "productName") == "NVIDIA A100-SXM4-80GB"
    assert attribute(mig, "resourceName") == "nvidia.com/mig-3g.40gb"
    assert set(mig["capacity"]) == {
        "multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines", "memory",
        "memorySlice4", "memorySlice5", "memorySlice6", "memorySlice7",
    }  # fmt: skip
    assert mig["capacity"]["multiprocessors"] == {"value": "42"}
    assert "gpu-1" not in by_name  # a GPU in MIG mode is its MIG devices
    assert "gpu-3" in by_name  # GPU 3 is not in MIG mode


def test_versions_are_strict_semver_as_nvidia_publishes_them() -> None:
    assert semver("535.104.05") == "535.104.5"
    assert semver("12.4") == "12.4.0"
    assert semver("8.0") == "8.0.0"
    assert semver("550.54.15") == "550.54.15"
    assert semver("570.00.01") == "570.0.1"
    assert semver("abc") is None and semver("1.2.3.4") is None and semver("") is None
    assert quantity(85899345920) == "80Gi" and quantity(1536 * 1024**2) == "1536Mi" and quantity(7) == "7"


def test_a_driver_version_with_leading_zeros_is_published_without_them(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(
        'driver_version: "535.104.05"\ngpus: [{name: NVIDIA A100-SXM4-80GB, memory_mib: 81920}]\n'
    )
    (device,) = devices(plan(str(node)))
    assert attribute(device, "driverVersion") == "535.104.5"
    validate_objects(plan(str(node)).slices)


def test_only_the_gpus_dra_owns_are_published() -> None:
    result = plan("dgx-a100", dra="dra: {enabled: true, gpus: [1, 6]}")
    assert [d["name"] for d in devices(result)] == ["gpu-1", "gpu-6"]
    assert result.owned == (1, 6)
    nothing = plan("dgx-a100", dra="dra: {enabled: true, gpus: []}")
    assert devices(nothing) == [] and len(nothing.slices) == 1  # an empty pool still says so
    validate_objects(nothing.slices)


def _classes(result: DryRun) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c["spec"] for c in result.classes}


def test_classes_follow_the_config_mixed_mig() -> None:
    classes = _classes(plan("a100-mig-mixed", CONFIGS["mixed"]))
    assert {n: c.get("extendedResourceName") for n, c in classes.items()} == {
        "gpu.nvidia.com": "nvidia.com/gpu",
        "mig.nvidia.com": None,
        "mig-1g.10gb.nvidia.com": "nvidia.com/mig-1g.10gb",
        "mig-2g.20gb.nvidia.com": "nvidia.com/mig-2g.20gb",
        "mig-3g.40gb.nvidia.com": "nvidia.com/mig-3g.40gb",
    }
    assert classes["mig-1g.10gb.nvidia.com"]["selectors"] == [
        {
            "cel": {
                "expression": 'device.driver == "gpu.nvidia.com" && '
                'device.attributes["gpu.nvidia.com"].resourceName == "nvidia.com/mig-1g.10gb"'
            }
        }
    ]


def test_under_single_nvidia_com_gpu_is_the_mig_class() -> None:
    classes = _classes(plan("a100-mig-single", CONFIGS["single"]))
    assert classes["mig.nvidia.com"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in classes["gpu.nvidia.com"]


def test_time_slicing_is_one_shareable_device_with_shares_and_no_memory_by_default() -> None:
    result = plan("dgx-a100", CONFIGS["time-slicing"])
    classes = _classes(result)
    assert classes["gpu.shared.nvidia.com"]["extendedResourceName"] == "nvidia.com/gpu.shared"
    assert "extendedResourceName" not in classes["gpu.nvidia.com"]  # no unshared nvidia.com/gpu is left
    gpu0 = devices(result)[0]
    assert gpu0["allowMultipleAllocations"] is True
    assert attribute(gpu0, "sharing") == "time-slicing"
    assert gpu0["capacity"]["shares"] == {
        "value": "4",
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
    }
    assert gpu0["capacity"]["memory"]["requestPolicy"]["default"] == "0"
    in_place = _classes(plan("dgx-a100", CONFIGS["time-slicing"].replace("    renameByDefault: true\n", "")))
    assert in_place["gpu.shared.nvidia.com"]["extendedResourceName"] == "nvidia.com/gpu"


def test_renamed_resources_get_their_own_class() -> None:
    classes = _classes(plan("mixed-a100-h100", CONFIGS["renamed"]))
    assert classes["h100.nvidia.com"]["extendedResourceName"] == "nvidia.com/h100"
    assert classes["gpu.nvidia.com"]["extendedResourceName"] == "nvidia.com/gpu"


def test_mps_resources_get_a_class_whose_devices_are_shared_as_its_replicas() -> None:
    text = "version: v1\nsharing:\n  mps:\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n"
    result = plan("dgx-a100", text)
    classes = _classes(result)
    assert sorted(classes) == ["gpu.nvidia.com", "gpu.shared.nvidia.com", "mig.nvidia.com"]
    assert classes["gpu.shared.nvidia.com"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in classes["gpu.nvidia.com"]
    # each GPU takes as many claims as the config's replicas, each an MPS client with one replica's limits
    assert all(
        attribute(d, "sharing") == "mps" and d["capacity"]["shares"]["value"] == "2" for d in devices(result)
    )


def test_taints_halve_the_slice_size() -> None:
    device = {"name": "gpu-0", "attributes": {}}
    tainted = {
        "name": "gpu-1",
        "taints": [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}],
    }
    assert [len(c) for c in chunk_devices([device] * 200)] == [128, 72]
    assert [len(c) for c in chunk_devices([tainted] + [device] * 199)] == [64, 128, 8]
    assert chunk_devices([]) == [[]]


def test_dra_plan_writes_one_yaml_file_per_object(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIGS["mixed"] + "dra: {enabled: true}\n")
    out = tmp_path / "out"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "nvidia_device_plugin", "dra", "plan", "--simulate", "a100-mig-mixed"),
            *("--config-file", str(config), "--output-dir", str(out), "--node-name", "n1"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    files = sorted(p.name for p in out.iterdir())
    assert "resourceslice-n1-gpu.nvidia.com-0.yaml" in files and "deviceclass-gpu.nvidia.com.yaml" in files
    objects = [yaml.safe_load(p.read_text()) for p in sorted(out.iterdir())]
    assert validate_objects(objects) == len(files) == 6
    assert "1 ResourceSlice(s) with 14 device(s) of GPUs 0, 1, 2, 3, 5 DeviceClass(es)" in done.stdout


def test_an_unknown_dra_gpu_is_a_config_error_naming_it() -> None:
    with pytest.raises(Exception, match=r"dra\.gpus names GPU 9, which this node does not have"):
        plan("t4-single", dra="dra: {enabled: true, gpus: [9]}")


def test_gpu_names_use_the_minor_not_the_index() -> None:
    gpu = Gpu(
        index=0,
        uuid="GPU-1",
        name="x",
        memory_bytes=1,
        pci_bus_id="",
        minor=5,
        numa_node=None,
        mig_enabled=False,
    )
    from nvidia_device_plugin.dra.names import gpu_device_name

    assert gpu_device_name(gpu) == "gpu-5" and Config().dra == Dra()


@pytest.mark.parametrize("preset", ["dgx-a100", "a100-mig-mixed"])
def test_each_device_kind_says_the_same_thing_to_the_slices_cdi_and_the_device_plugin(preset: str) -> None:
    from nvidia_device_plugin.dra.names import KINDS, published_devices
    from nvidia_device_plugin.dra.slices import node_devices

    session = open_nvml(preset)
    try:
        snapshot = build_snapshot(session, parse_config_text("version: v1\nflags: {migStrategy: mixed}\n"))
    finally:
        session.close()
    inventory = snapshot.inventory
    published = published_devices(inventory)
    entries = {
        d["name"]: d for d in node_devices(inventory, snapshot.plans, {g.uuid for g in inventory.gpus})
    }
    plugin = {d.physical_uuid: d for p in snapshot.plans for d in p.devices}
    assert published and set(entries) == set(published)
    for name, device in published.items():
        assert device.kind in KINDS
        assert attribute(entries[name], "type") == device.kind.name
        advertised = device.kind.advertised(device)
        assert advertised.kind == device.kind.name and advertised.physical_uuid == device.uuid
        assert advertised == plugin[device.uuid]  # the device the device plugin advertises for it

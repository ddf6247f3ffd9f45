"""DRA names, attributes and capacities as NVIDIA's DRA driver publishes them (kubernetes-sigs/
dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin/mig.go `MigSpecTuple.ToCanonicalName` and deviceinfo.go
`MigDeviceInfo.GetDevice`): `gpu-<minor>-mig-<profile without dots>-<GI profile ID>-<placement start>`, a
`memorySlice<N>: 1` capacity per memory slice the device occupies, beside memory, multiprocessors and the
engines."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from nvidia_device_plugin.config.loader import parse_config_text
from nvidia_device_plugin.dra.dryrun import DryRun, dry_run
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.snapshot import build_snapshot

from support.dra_rules import validate_objects

MIG_PRESETS = ("a100-mig-mixed", "a100-mig-single", "h100-nvl", "h200-mig", "b200")
NVIDIA_MIG_NAME = re.compile(r"gpu-(\d+)-mig-([a-z0-9]+(?:-[a-z0-9]+)*)-(\d+)-(\d+)")
ENGINES = {"multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines", "memory"}


def plan(preset: str, text: str = "") -> DryRun:
    session = open_nvml(preset)
    try:
        config = parse_config_text("version: v1\n" + text + "dra: {enabled: true}\n")
        return dry_run(build_snapshot(session, config), "n")
    finally:
        session.close()


def _migs(result: DryRun) -> list[dict[str, Any]]:
    return [
        d for s in result.slices for d in s["spec"]["devices"] if d["attributes"]["type"]["string"] == "mig"
    ]


@pytest.mark.parametrize("preset", MIG_PRESETS)
def test_static_mig_devices_carry_nvidias_names_and_capacities(preset: str) -> None:
    session = open_nvml(preset)
    try:
        inventory = build_snapshot(session, parse_config_text("version: v1\n")).inventory
    finally:
        session.close()
    expected = {
        mig.uuid: (gpu.minor, mig.profile, mig.gi_profile_info_id, mig.placement)
        for gpu in inventory.gpus
        for mig in gpu.mig_devices
    }
    migs = _migs(plan(preset))
    assert migs, f"{preset} publishes no MIG device"
    for device in migs:
        minor, profile, profile_id, placement = expected[device["attributes"]["uuid"]["string"]]
        assert placement is not None
        match = NVIDIA_MIG_NAME.fullmatch(device["name"])
        assert match, f"{device['name']} is not NVIDIA's MIG device name"
        assert len(device["name"]) <= 63
        assert match.groups() == (
            str(minor),
            re.sub(r"[^a-z0-9-]", "-", profile.replace(".", "")).strip("-"),
            str(profile_id),
            str(placement[0]),
        )
        slices = {f"memorySlice{n}" for n in range(placement[0], placement[0] + placement[1])}
        assert set(device["capacity"]) == ENGINES | slices
        assert all(device["capacity"][s] == {"value": "1"} for s in slices)


def test_the_example_name_of_the_issue() -> None:
    names = [d["name"] for d in _migs(plan("a100-mig-mixed"))]
    assert "gpu-0-mig-1g10gb-19-0" in names  # 1g.10gb, GI profile ID 19 (NVIDIA's), slice 0
    h200 = [d["name"] for d in _migs(plan("h200-mig"))]
    assert "gpu-1-mig-1g18gb-me-20-6" in h200  # "1g.18gb+me": '+' is no DNS label character


@pytest.mark.parametrize("preset", MIG_PRESETS)
def test_mig_names_stay_valid_with_time_sliced_mig_devices(preset: str) -> None:
    text = (
        "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n"
        "    resources: [{name: nvidia.com/gpu, replicas: 4}, {name: nvidia.com/mig-1g.10gb, replicas: 4}]\n"
    )
    result = plan(preset, text)
    assert validate_objects([*result.slices, *result.classes]) == len(result.slices) + len(result.classes)


def test_a_time_sliced_full_gpu_mig_device_stays_within_the_apis_32_attributes_and_capacities(
    tmp_path: Path,
) -> None:
    node = tmp_path / "node.yaml"
    gpu = "  - {name: NVIDIA A100-SXM4-80GB, memory_mib: 81920, numa_node: 0, mig: [7g.80gb], pci_bus_id: %s}"
    node.write_text(
        'driver_version: "550.54.15"\ncuda_driver_version: 12040\ngpus:\n'
        + "\n".join(gpu % bus for bus in ('"00000000:07:00.0"', '"00000000:0F:00.0"'))
        + "\nnvlinks:\n  - [0, 1, 12]\n"
    )
    unshared = _migs(plan(str(node), "flags: {migStrategy: mixed}\n"))
    assert all(len(d["attributes"]) + len(d["capacity"]) == 32 for d in unshared)  # 8 memory slices fit
    assert "memorySlice7" in unshared[0]["capacity"]
    text = (
        "flags: {migStrategy: mixed}\n"
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/mig-7g.80gb, replicas: 2}]}}\n"
    )
    result = plan(str(node), text)
    shared = _migs(result)
    assert shared and all("shares" in d["capacity"] for d in shared)
    assert not any(n.startswith("memorySlice") for d in shared for n in d["capacity"])  # the name says where
    assert validate_objects(result.slices) == len(result.slices)

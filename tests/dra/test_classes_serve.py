"""The DeviceClasses on every preset and config, evaluated with cel-python against the devices the node
publishes: NVIDIA's classes select devices under every config, every resource name the device plugin
advertises is served by exactly one class whose selector picks the devices that carry it, and a whole-GPU
claim still fits on a time-sliced node."""

from __future__ import annotations

from typing import Any

import pytest
from test_slices_cel import selected

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.loader import parse_config_text
from nvidia_device_plugin.devices import Gpu
from nvidia_device_plugin.dra.classes import device_classes
from nvidia_device_plugin.dra.dryrun import DryRun, dry_run
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.nvml.sim.node import preset_names
from nvidia_device_plugin.plans.resources import ResourcePlan, whole_gpu_device
from nvidia_device_plugin.snapshot import build_snapshot

_GPU_X4 = "resources: [{name: nvidia.com/gpu, replicas: 4}]"
CONFIGS = {
    "none": "",
    "mixed": "flags: {migStrategy: mixed}\n",
    "single": "flags: {migStrategy: single}\n",
    "time-slicing": f"sharing: {{timeSlicing: {{renameByDefault: true, {_GPU_X4}}}}}\n",
    "time-slicing-in-place": f"sharing: {{timeSlicing: {{{_GPU_X4}}}}}\n",
    "mps": f"sharing: {{mps: {{{_GPU_X4}}}}}\n",
    "mps-renamed": f"sharing: {{mps: {{renameByDefault: true, {_GPU_X4}}}}}\n",
}


def plan_and_names(preset: str, text: str) -> tuple[DryRun, set[str]]:
    """The dry run and the resource names the device plugin advertises under the same config."""
    session = open_nvml(preset)
    try:
        snapshot = build_snapshot(
            session, parse_config_text("version: v1\n" + text + "dra: {enabled: true}\n")
        )
    finally:
        session.close()
    return dry_run(snapshot, "n"), {p.name for p in snapshot.plans}


def _devices(result: DryRun) -> list[dict[str, Any]]:
    return [d for s in result.slices for d in s["spec"]["devices"]]


def _expression(device_class: dict[str, Any]) -> str:
    (selector,) = device_class["spec"]["selectors"]
    return str(selector["cel"]["expression"])


def _of_type(devices: list[dict[str, Any]], kind: str) -> list[str]:
    return [d["name"] for d in devices if d["attributes"]["type"]["string"] == kind]


@pytest.mark.parametrize("preset", preset_names())
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_advertised_name_is_served_by_exactly_one_class_that_selects_its_devices(
    preset: str, config: str
) -> None:
    try:
        result, advertised = plan_and_names(preset, CONFIGS[config])
    except Exception as exc:  # a config this node cannot serve (MPS on MIG devices): refused, not planned
        pytest.skip(f"{config} does not apply to {preset}: {exc}")
    devices = _devices(result)
    classes = {c["metadata"]["name"]: c for c in result.classes}
    # NVIDIA's classes select every device of their type, shared or not
    assert set(_of_type(devices, "gpu")) <= set(selected(_expression(classes["gpu.nvidia.com"]), devices))
    assert set(_of_type(devices, "mig")) == set(selected(_expression(classes["mig.nvidia.com"]), devices))
    serving = {c["spec"].get("extendedResourceName") for c in result.classes} - {None}
    assert serving == advertised, f"served {sorted(serving)}, advertised {sorted(advertised)}"
    for name in advertised:
        (device_class,) = [c for c in result.classes if c["spec"].get("extendedResourceName") == name]
        chosen = set(selected(_expression(device_class), devices))
        carrying = {d["name"] for d in devices if d["attributes"]["resourceName"]["string"] == name}
        assert carrying and carrying <= chosen, (
            f"{name}: class selects {sorted(chosen)}, not {sorted(carrying)}"
        )


def _fits(device: dict[str, Any], asked: int) -> bool:
    """Whether a request for `asked` shares fits the device's consumable capacity (KEP-5075): within the
    request policy's valid range and the device's `shares`."""
    shares = device["capacity"]["shares"]
    valid = shares["requestPolicy"]["validRange"]
    return int(valid["min"]) <= asked <= int(valid["max"]) and asked <= int(shares["value"])


def test_a_whole_gpu_claim_matches_on_a_time_sliced_node_and_takes_every_share() -> None:
    result, _ = plan_and_names("dgx-a100", CONFIGS["time-slicing"])
    devices = _devices(result)
    classes = {c["metadata"]["name"]: c for c in result.classes}
    chosen = selected(_expression(classes["gpu.nvidia.com"]), devices)
    assert chosen == [f"gpu-{n}" for n in range(8)]
    gpu0 = devices[0]
    assert gpu0["allowMultipleAllocations"] is True
    assert _fits(gpu0, 4) and not _fits(gpu0, 5)  # all four shares: no time-slice is left for another claim


def _claims_fitting(device: dict[str, Any], asked: int) -> int:
    """How many claims asking `asked` shares each the device takes at once: each fits the request policy,
    and together they consume at most its `shares`."""
    if not _fits(device, asked):
        return 0
    return int(device["capacity"]["shares"]["value"]) // asked


def test_an_mps_shared_gpu_serves_four_claims_of_one_share_through_the_nvidia_com_gpu_class() -> None:
    result, advertised = plan_and_names("dgx-a100", CONFIGS["mps"])
    assert advertised == {"nvidia.com/gpu"}
    (device_class,) = [c for c in result.classes if c["spec"].get("extendedResourceName") == "nvidia.com/gpu"]
    devices = _devices(result)
    assert selected(_expression(device_class), devices) == [f"gpu-{n}" for n in range(8)]
    gpu0 = devices[0]
    assert gpu0["allowMultipleAllocations"] is True
    assert gpu0["attributes"]["sharing"] == {"string": "mps"}
    one_share = int(gpu0["capacity"]["shares"]["requestPolicy"]["default"])
    assert one_share == 1
    assert _claims_fitting(gpu0, one_share) == 4  # four replicas: a fifth claim finds no share left


def test_under_strategy_none_a_mig_node_serves_nvidia_com_gpu_from_its_mig_devices() -> None:
    result, advertised = plan_and_names("a100-mig-single", "")
    assert advertised == {"nvidia.com/gpu"}
    classes = {c["metadata"]["name"]: c for c in result.classes}
    assert classes["gpu.nvidia.com"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    chosen = selected(_expression(classes["gpu.nvidia.com"]), _devices(result))
    assert chosen and all("-mig-" in n for n in chosen)


def test_two_resources_that_would_share_a_class_name_are_a_config_error_naming_both() -> None:
    gpu = Gpu(
        index=0,
        uuid="GPU-0",
        name="x",
        memory_bytes=1,
        pci_bus_id="",
        minor=0,
        numa_node=None,
        mig_enabled=False,
    )
    device = whole_gpu_device(gpu)
    plans = [
        ResourcePlan("nvidia.com/gpu", (device,), "time-slicing", 2),
        ResourcePlan("nvidia.com/gpu.shared", (device,), "time-slicing", 2),
    ]
    with pytest.raises(ConfigError, match=r"nvidia\.com/gpu\.shared and nvidia\.com/gpu would both need "):
        device_classes(plans)

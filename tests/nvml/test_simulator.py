"""The pynvml simulator is faithful to pynvml's API, and discovery reads presets correctly through it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pynvml
import pytest

import nvidia_device_plugin
from nvidia_device_plugin.base.errors import ConfigError, NvmlError
from nvidia_device_plugin.devices import PcieLevel
from nvidia_device_plugin.nvml.api import NvmlApi, api_functions
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.mig_profiles import mig_profile_name
from nvidia_device_plugin.nvml.pci import read_numa_node
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.nvml.sim.node import load_node, preset_names
from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml, simulated_functions

from support.checks import assert_all

PACKAGE = Path(nvidia_device_plugin.__file__).parent


def _parameters(fn: object, drop_self: bool) -> list[tuple[str, object]]:
    params = list(inspect.signature(fn).parameters.values())  # type: ignore[arg-type]
    return [(p.name, p.default) for p in params[1 if drop_self else 0 :]]


@pytest.mark.parametrize("name", api_functions())
def test_every_api_function_exists_with_pynvml_signature_on_pynvml_and_the_simulator(name: str) -> None:
    declared = _parameters(getattr(NvmlApi, name), drop_self=True)
    real = getattr(pynvml, name, None)
    assert callable(real), f"NvmlApi declares {name}, which pynvml does not have"
    assert _parameters(real, drop_self=False) == declared, f"NvmlApi.{name} differs from pynvml's"
    # Looked up without calling __getattr__: the function must be defined by the simulator's classes.
    simulated = inspect.getattr_static(SimulatedNvml, name, None)
    assert simulated is not None, f"the simulator lacks {name}, which NvmlApi declares"
    assert _parameters(simulated, drop_self=True) == declared, f"SimulatedNvml.{name} differs from pynvml's"


def test_the_simulator_implements_exactly_the_api() -> None:
    # Extra simulated functions would be untested fakes of calls nothing makes.
    assert simulated_functions() == api_functions()


def _nvml_functions_named_in(path: Path) -> set[str]:
    """pynvml functions a module refers to as `<something>.nvmlX` (called, or passed on to be called)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("nvml")
        # a function: not a constant (nvmlEventTypeXidCriticalError) or a struct (nvmlPciInfo_t)
        and inspect.isfunction(getattr(pynvml, node.attr, None))
    }


def test_product_code_calls_only_nvml_functions_the_api_declares() -> None:
    used: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in _nvml_functions_named_in(path):
            used.setdefault(name, set()).add(str(path.relative_to(PACKAGE)))
    assert "nvmlEventSetWait_v2" in used and "nvmlDeviceGetCount" in used  # the scan sees product calls
    undeclared = {name: sorted(where) for name, where in used.items() if name not in api_functions()}
    assert undeclared == {}, "declare these in nvml/api.py (NvmlApi) and implement them in the simulator"


def test_the_scan_finds_calls_in_any_form(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f(nv, pynvml):\n"
        "    nv.nvmlDeviceGetPowerUsage(h)\n"
        "    call(pynvml.nvmlDeviceGetTemperature, h)\n"
        "    return pynvml.NVML_ERROR_TIMEOUT, nv.nvmlEventTypeXidCriticalError, pynvml.nvmlPciInfo_t()\n"
    )
    assert _nvml_functions_named_in(module) == {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature"}


def test_an_unimplemented_function_is_refused_by_name() -> None:
    sim = SimulatedNvml(load_node("t4-single"))
    with pytest.raises(
        AttributeError, match=r"does not implement nvmlDeviceGetPowerUsage; add it to nvml/sim"
    ):
        sim.nvmlDeviceGetPowerUsage  # noqa: B018 - the lookup itself must fail
    # Constants, structs and exception classes are still pynvml's own.
    assert sim.NVML_ERROR_TIMEOUT == pynvml.NVML_ERROR_TIMEOUT
    assert sim.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost
    assert sim.nvmlPciInfo_t is pynvml.nvmlPciInfo_t
    with pytest.raises(AttributeError):
        sim.no_such_name  # noqa: B018


def test_presets_exist() -> None:
    assert {"dgx-a100", "dgx-h100", "a100-mig-mixed", "mixed-a100-h100", "t4-single"} <= set(preset_names())
    assert {"h100-nvl", "h200-mig", "b200", "dgx-a100-nps4"} <= set(preset_names())
    assert {g.numa_node for g in load_node("dgx-a100-nps4").gpus} == set(range(8))


def test_returns_pynvml_types_and_error_classes() -> None:
    sim = SimulatedNvml(load_node("dgx-a100"))
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()
    sim.nvmlInit()
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(handle, pynvml.c_nvmlDevice_t)
    assert isinstance(sim.nvmlDeviceGetMemoryInfo(handle), pynvml.c_nvmlMemory_t)
    assert isinstance(
        sim.nvmlDeviceGetPciInfo(handle), pynvml.nvmlPciInfo_t
    )  # busId decoding is pynvml's own
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetHandleByIndex(8)
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait_v2(sim.nvmlEventSetCreate(), 1)


def test_an_interrupted_wait_returns_as_a_timeout_and_events_come_first() -> None:
    sim = SimulatedNvml(load_node("dgx-a100"))
    sim.nvmlInit()
    events = sim.nvmlEventSetCreate()
    sim.nvmlDeviceRegisterEvents(
        sim.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, events
    )
    sim.inject_xid(0, 79)
    sim.interrupt_event_wait(events)  # posted before the wait: the wait still returns the queued event
    assert sim.nvmlEventSetWait_v2(events, 3_600_000).eventData == 79
    # Then the interrupt: an hour-long wait returns at once (pytest's timeout fails the test otherwise).
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait_v2(events, 3_600_000)


def test_injected_failures_and_lost_gpus_raise_real_codes() -> None:
    sim = SimulatedNvml(load_node("dgx-a100"))
    sim.nvmlInit()
    sim.fail_next("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(pynvml.NVMLError_Unknown):
        sim.nvmlDeviceGetCount()
    assert sim.nvmlDeviceGetCount() == 8
    handle = sim.nvmlDeviceGetHandleByIndex(3)
    sim.set_lost(3, True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetUUID(handle)
    sim.set_lost(3, False)
    assert sim.nvmlDeviceGetUUID(handle).startswith("GPU-")
    with pytest.raises(ValueError, match="not a simulated pynvml function"):
        sim.fail_next("nvmlNoSuchThing", 1)


def test_events_reach_registered_sets_with_mig_attribution() -> None:
    sim = SimulatedNvml(load_node("a100-mig-mixed"))
    sim.nvmlInit()
    events = sim.nvmlEventSetCreate()
    gpu1 = sim.nvmlDeviceGetHandleByIndex(1)
    sim.nvmlDeviceRegisterEvents(gpu1, pynvml.nvmlEventTypeXidCriticalError, events)
    sim.inject_xid(0, 79)  # GPU 0 is not registered: nothing arrives
    mig_uuid = sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetMigDeviceHandleByIndex(gpu1, 2))
    sim.inject_xid(mig_uuid, 94)
    data = sim.nvmlEventSetWait_v2(events, 100)
    assert sim.nvmlDeviceGetUUID(data.device) == sim.nvmlDeviceGetUUID(gpu1)
    assert data.eventData == 94
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(gpu1, 2)
    assert data.gpuInstanceId == sim.nvmlDeviceGetGpuInstanceId(mig)
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait_v2(events, 1)


def test_discovery_of_dgx_a100() -> None:
    with open_nvml("dgx-a100") as session:
        inventory = discover(session.nv, session.host.sysfs_root)
    assert len(inventory.gpus) == 8
    gpu = inventory.gpus[0]
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    assert gpu.memory_bytes == 80 * 1024**3
    assert gpu.pci_bus_id == "00000000:07:00.0"
    assert [g.numa_node for g in inventory.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert not gpu.mig_enabled
    assert len(inventory.links) == 28
    assert_all(inventory.links, lambda link: link.nvlinks == 12)  # every pair through NVSwitch
    pair01, pair04 = inventory.link(0, 1), inventory.link(4, 0)
    assert pair01 is not None and pair01.pcie == PcieLevel.SINGLE
    assert pair04 is not None and pair04.pcie == PcieLevel.SYSTEM
    assert inventory.driver_version == "550.54.15"


def test_discovery_of_mig_and_pcie_pairs() -> None:
    with open_nvml("a100-mig-mixed") as session:
        inventory = discover(session.nv, session.host.sysfs_root)
    profiles = [[m.profile for m in g.mig_devices] for g in inventory.gpus]
    assert profiles == [["1g.10gb"] * 7, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"], ["3g.40gb"] * 2, []]
    mig = inventory.gpus[1].mig_devices[0]
    assert mig.parent_uuid == inventory.gpus[1].uuid and mig.parent_index == 1 and mig.index == 0
    assert mig.uuid.startswith("MIG-")
    assert inventory.gpus[3].mig_enabled is False

    with open_nvml("pcie-nvlink-pairs") as session:
        inventory = discover(session.nv, session.host.sysfs_root)
    lanes = {(link.a, link.b): link.nvlinks for link in inventory.links}
    assert lanes == {(0, 1): 12, (2, 3): 12, (0, 2): 0, (0, 3): 0, (1, 2): 0, (1, 3): 0}


def test_unknown_numa_is_none_and_t4_has_no_mig() -> None:
    with open_nvml("t4-single") as session:
        inventory = discover(session.nv, session.host.sysfs_root)
    assert inventory.gpus[0].numa_node is None
    assert inventory.gpus[0].mig_enabled is False
    assert inventory.links == ()


def test_numa_from_sysfs(tmp_path: Path) -> None:
    dev = tmp_path / "bus/pci/devices/0000:07:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    assert read_numa_node("00000000:07:00.0", tmp_path) == 1
    assert read_numa_node("00000000:08:00.0", tmp_path) is None


@pytest.mark.parametrize(
    ("slices", "compute", "memory_mb", "gpu_gb", "expected"),
    [
        (1, 1, 9856, 80, "1g.10gb"),
        (2, 2, 19968, 80, "2g.20gb"),
        (3, 3, 40192, 80, "3g.40gb"),
        (7, 7, 80384, 80, "7g.80gb"),
        (1, 1, 4864, 40, "1g.5gb"),
        (2, 1, 9856, 40, "1c.2g.10gb"),
    ],
)
def test_mig_profile_names(slices: int, compute: int, memory_mb: int, gpu_gb: int, expected: str) -> None:
    assert mig_profile_name(slices, compute, memory_mb, gpu_gb * 1024**3) == expected


def test_missing_driver_is_a_clear_error() -> None:
    with pytest.raises(NvmlError, match="NVIDIA driver library not found: is this a GPU node"):
        open_nvml(None)


def test_nvml_failure_during_discovery_names_the_call_and_serves_the_rest() -> None:
    sim = SimulatedNvml(load_node("dgx-a100"))
    sim.nvmlInit()
    sim.fail_next("nvmlDeviceGetUUID", pynvml.NVML_ERROR_UNKNOWN)
    inventory = discover(sim, sim.materialize_host().sysfs_root)
    assert [g.index for g in inventory.gpus] == [1, 2, 3, 4, 5, 6, 7]
    assert [p.message for p in inventory.problems] == [
        "reading GPU 0: Unknown Error (NVML error 999); not advertised"
    ]
    sim.close()


@pytest.mark.parametrize(
    ("slices", "memory_mb", "total_mib", "expected"),
    [
        (3, 71424, 143771, "3g.71gb"),  # H200: 70.5 rounds away from zero
        (4, 71424, 143771, "4g.71gb"),
        (1, 22528, 183359, "1g.23gb"),  # B200: 22.5
        (1, 4864, 40960, "1g.5gb"),  # A100-40GB
        (3, 19968, 40960, "3g.20gb"),
        (1, 9856, 81920, "1g.10gb"),  # A100-80GB
        (1, 19968, 81920, "1g.20gb"),
        (7, 80384, 81920, "7g.80gb"),
        (1, 9984, 81559, "1g.10gb"),  # H100-80GB
        (3, 40448, 81559, "3g.40gb"),
        (1, 11008, 95830, "1g.12gb"),  # H100 NVL 94GB
        (3, 46848, 95830, "3g.47gb"),
        (7, 93184, 95830, "7g.94gb"),
    ],
)
def test_mig_names_round_half_away_from_zero(
    slices: int, memory_mb: int, total_mib: int, expected: str
) -> None:
    assert mig_profile_name(slices, slices, memory_mb, total_mib * 1024**2) == expected


def test_mig_profile_ids_name_attributes_and_compute_sub_profiles() -> None:
    from nvidia_device_plugin.nvml.mig_profiles import GPU_INSTANCE_PROFILES

    gib = 80 * 1024**3
    names = {
        pid: mig_profile_name(s, s, 9856 * s if s < 7 else 80384, gib, suffix)
        for pid, (s, suffix) in GPU_INSTANCE_PROFILES.items()
        if s in (1, 2)
    }
    assert names[pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1] == "1g.10gb+me"
    assert names[pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME] == "1g.10gb-me"
    assert names[pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX] == "1g.10gb+gfx"
    assert names[pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME] == "2g.20gb+me.all"
    assert mig_profile_name(3, 1, 40192, gib) == "1c.3g.40gb"


def test_simulated_mig_devices_carry_profile_ids_so_plus_me_is_discovered() -> None:
    sim = SimulatedNvml(load_node("h200-mig"))
    sim.nvmlInit()
    inventory = discover(sim, sim.materialize_host().sysfs_root)
    profiles = [[m.profile for m in g.mig_devices] for g in inventory.gpus]
    assert profiles == [
        ["3g.71gb", "3g.71gb"],
        ["4g.71gb", "2g.35gb", "1g.18gb+me"],
        ["1g.18gb"] * 7,
        [],
    ]
    me = inventory.gpus[1].mig_devices[2]
    assert me.profile_id == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
    sim.close()


def test_nvswitch_bus_ids_cannot_collide_with_gpus() -> None:
    sim = SimulatedNvml(load_node("dgx-h100"))  # GPU 5 sits at bus C3, where a switch used to be
    sim.nvmlInit()
    # An older driver without the remote-type call: a remote bus ID that is a GPU's counts as that GPU.
    sim.fail_always("nvmlDeviceGetNvLinkRemoteDeviceType", pynvml.NVML_ERROR_NOT_SUPPORTED)
    inventory = discover(sim, sim.materialize_host().sysfs_root)
    assert {link.nvlinks for link in inventory.links} == {18}
    sim.close()


def test_node_file_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "node.yaml"
    bad.write_text("gpus:\n  - {name: X, memory_mib: 1024, mig: [9g.1gb]}\n")
    with pytest.raises(ConfigError, match=r"gpus\[0\]"):
        load_node(str(bad))
    bad.write_text("gpus:\n  - {name: X, memory_mb: 1024}\n")
    with pytest.raises(ConfigError, match=r"unknown node field gpus\[0\]\.memory_mb"):
        load_node(str(bad))
    with pytest.raises(ConfigError, match="neither a preset"):
        load_node("no-such-node")

"""MIG management through the NVML seam (nvml/mig_manager.py) on the simulated driver: instances made at
distinct placements until the slices run out, destroyed with gaps left in the MIG indices, refused while
in use or without permission, a hung create bounded by the call deadline, nothing half made, and
discovery sees what was made."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.errors import NvmlErrorKind, classify
from nvidia_device_plugin.nvml.mig_manager import MadeMigDevice, MigChangeFailed, MigManager, Placement
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.nvml.sim.node import load_node, parse_node
from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml

ONE_G, TWO_G, THREE_G = 19, 14, 9  # NVIDIA's profile IDs of 1g.10gb, 2g.20gb, 3g.40gb on A100-80GB


@pytest.fixture
def sim() -> Iterator[SimulatedNvml]:
    sim = SimulatedNvml(load_node("a100-mig-dynamic"))
    sim.nvmlInit()
    yield sim
    sim.close()


def _refused(kind: NvmlErrorKind, make: object) -> MigChangeFailed:
    assert callable(make)
    with pytest.raises(MigChangeFailed) as failed:
        make()
    assert failed.value.kind is kind, str(failed.value)
    return failed.value


def test_possible_placements_are_every_profiles(sim: SimulatedNvml) -> None:
    placements = MigManager(sim).possible_placements(0)
    assert [p.start for p in placements if p.gi_profile_id == ONE_G] == list(range(7))
    assert Placement(THREE_G, 4, 4) in placements and Placement(0, 0, 8) in placements
    assert len(placements) == 25


def test_seven_1g_instances_at_distinct_placements_then_no_room_for_an_eighth(sim: SimulatedNvml) -> None:
    manager = MigManager(sim)
    made = [manager.create(0, ONE_G, start) for start in range(7)]
    assert len({m.uuid for m in made}) == 7 and all(m.uuid.startswith("MIG-") for m in made)
    assert len({m.gi_id for m in made}) == 7
    failed = _refused(NvmlErrorKind.INSUFFICIENT_RESOURCES, lambda: manager.create(0, ONE_G, 3))
    assert "not enough free MIG slices" in str(failed) and "GPU 0" in str(failed)
    assert failed.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    # The other GPU is untouched.
    assert manager.create(1, ONE_G, 0).uuid not in {m.uuid for m in made}


def test_a_destroyed_instance_frees_its_slices_for_a_larger_profile_where_they_are_free(
    sim: SimulatedNvml,
) -> None:
    manager = MigManager(sim)
    made = {start: manager.create(0, ONE_G, start) for start in range(7)}
    manager.destroy(0, made[3].gi_id, made[3].ci_id)
    # Slice 3 alone is free: a 2g (slices 2-3) does not fit, but a 1g does again.
    _refused(NvmlErrorKind.INSUFFICIENT_RESOURCES, lambda: manager.create(0, TWO_G, 2))
    manager.destroy(0, made[2].gi_id, made[2].ci_id)
    two = manager.create(0, TWO_G, 2)
    gpu = discover(sim).gpus[0]
    assert next(m for m in gpu.mig_devices if m.uuid == two.uuid).placement == (2, 2)


def test_a_start_that_is_no_placement_of_the_profile_is_refused_naming_the_possible_ones(
    sim: SimulatedNvml,
) -> None:
    failed = _refused(NvmlErrorKind.INVALID_ARGUMENT, lambda: MigManager(sim).create(0, THREE_G, 2))
    assert "possible: 0, 4" in str(failed)
    unknown = _refused(NvmlErrorKind.INVALID_ARGUMENT, lambda: MigManager(sim).create(0, 77, 0))
    assert "no MIG GPU-instance profile with ID 77" in str(unknown)


def test_destroy_answers_in_use_while_a_process_holds_the_instance(sim: SimulatedNvml) -> None:
    manager = MigManager(sim)
    made = manager.create(0, THREE_G, 0)
    sim.set_in_use(made.uuid)
    failed = _refused(NvmlErrorKind.IN_USE, lambda: manager.destroy(0, made.gi_id, made.ci_id))
    assert "in use" in str(failed)
    assert made.uuid in {m.uuid for m in discover(sim).gpus[0].mig_devices}  # nothing was destroyed
    sim.set_in_use(made.uuid, False)
    manager.destroy(0, made.gi_id, made.ci_id)
    assert discover(sim).gpus[0].mig_devices == ()
    manager.destroy(0, made.gi_id, made.ci_id)  # already gone: Unprepare may run twice


def test_destroys_leave_gaps_in_the_mig_device_indices(sim: SimulatedNvml) -> None:
    manager = MigManager(sim)
    made = [manager.create(0, ONE_G, start) for start in range(4)]
    for gone in (made[1], made[2]):
        manager.destroy(0, gone.gi_id, gone.ci_id)
    gpu = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError) as gap:
        sim.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1)
    assert classify(gap.value) is NvmlErrorKind.NOT_FOUND
    assert [(m.index, m.uuid) for m in discover(sim).gpus[0].mig_devices] == [
        (0, made[0].uuid),
        (3, made[3].uuid),
    ]
    again = manager.create(0, ONE_G, 5)  # the lowest free index is taken again
    assert next(m.index for m in discover(sim).gpus[0].mig_devices if m.uuid == again.uuid) == 1


def test_without_permission_nothing_is_made(tmp_path: Path) -> None:
    doc = {
        "unprivileged_container": True,
        "gpus": [{"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "mig": []}],
    }
    sim = SimulatedNvml(parse_node(doc, "node"))
    sim.nvmlInit()
    try:
        failed = _refused(NvmlErrorKind.NO_PERMISSION, lambda: MigManager(sim).create(0, ONE_G, 0))
        assert "no permission" in str(failed)
        assert sim.nvmlDeviceGetGpuInstanceRemainingCapacity(sim.nvmlDeviceGetHandleByIndex(0), ONE_G) == 7
    finally:
        sim.close()


def test_a_failed_compute_instance_leaves_no_gpu_instance_behind(sim: SimulatedNvml) -> None:
    sim.fail_next("nvmlGpuInstanceCreateComputeInstance", pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    _refused(NvmlErrorKind.INSUFFICIENT_RESOURCES, lambda: MigManager(sim).create(0, THREE_G, 4))
    gpu = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, THREE_G) == 2
    assert MigManager(sim).create(0, THREE_G, 4).gi_id > 0  # the placement is free again


@pytest.mark.parametrize(
    "call", ["nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceCreateComputeInstance"]
)
def test_a_hung_create_is_bounded_by_the_call_deadline_and_holds_up_no_other_gpu(call: str) -> None:
    session = open_nvml("a100-mig-dynamic", call_timeout_s=1.0)
    sim = session.simulator
    assert sim is not None
    try:
        manager = MigManager(session.nv)
        sim.hang(call, 0)  # a GPU-instance handle's call hangs on its GPU, as a device handle's does
        failed = _refused(NvmlErrorKind.STUCK, lambda: manager.create(0, ONE_G, 0))
        assert call in str(failed)
        assert manager.create(1, ONE_G, 0).uuid.startswith("MIG-")
    finally:
        sim.release()
        session.close()


def test_discovery_sees_what_was_made_with_nvidias_names_and_ids(sim: SimulatedNvml) -> None:
    manager = MigManager(sim)
    made = manager.create(1, THREE_G, 4)
    assert made == MadeMigDevice(made.gi_id, 0, made.uuid)
    gpu = discover(sim).gpus[1]
    (mig,) = gpu.mig_devices
    assert (mig.uuid, mig.profile, mig.gi_profile_info_id, mig.placement) == (made.uuid, "3g.40gb", 9, (4, 4))
    assert (mig.gpu_instance_id, mig.compute_instance_id) == (made.gi_id, made.ci_id)
    option = next(o for o in gpu.mig_placements if o.gi_profile_id == THREE_G and o.start == 4)
    assert option.attributes == mig.attributes  # the placement said what its MIG device reports
    assert sim.nvmlDeviceGetHandleByUUID(made.uuid) is not None


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (pynvml.NVML_ERROR_IN_USE, NvmlErrorKind.IN_USE),
        (pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, NvmlErrorKind.INSUFFICIENT_RESOURCES),
    ],
)
def test_mig_management_codes_have_kinds_of_their_own(code: int, kind: NvmlErrorKind) -> None:
    assert classify(pynvml.NVMLError(code)) is kind

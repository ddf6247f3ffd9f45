from __future__ import annotations

import threading

import pytest

from nvidia_device_plugin.base.errors import AllocationError
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.events import CauseKind, HealthCause, HealthChange
from nvidia_device_plugin.health.policy import LOST, RECOVERED
from nvidia_device_plugin.health.registry import HealthRegistry, UnhealthyIds
from nvidia_device_plugin.plans.resources import ResourcePlan, replica_id
from nvidia_device_plugin.serving.allocate import AllocationIndex, AllocationSettings, allocate

from support.builders import gpu_device, mig_device

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-1111-1111-1111-111111111111"
MIG0_0 = "MIG-00000000-aaaa-0000-0000-000000000000"
MIG0_1 = "MIG-00000000-bbbb-0000-0000-000000000000"


def xid(n: int) -> HealthCause:
    """A critical XID's cause, in short words."""
    return HealthCause(CauseKind.XID, f"XID {n}", n)


def plans() -> list[ResourcePlan]:
    """A node as a mixed strategy with time-slicing would advertise it: GPU 0 carved, GPU 1 whole."""
    return [
        ResourcePlan(
            name="nvidia.com/mig-1g.10gb",
            devices=tuple(
                mig_device(m, GPU0, 0, j, r) for j, m in enumerate((MIG0_0, MIG0_1)) for r in range(3)
            ),
            sharing="time-slicing",
            replicas=3,
        ),
        ResourcePlan(
            name="nvidia.com/gpu.shared",
            devices=tuple(gpu_device(GPU1, 1, r) for r in range(4)),
            sharing="time-slicing",
            replicas=4,
        ),
        ResourcePlan(name="nvidia.com/gpu", devices=(gpu_device(GPU0, 0),)),
    ]


def unhealthy_ids(registry: HealthRegistry) -> set[str]:
    return {d.id for plan in plans() for d in plan.devices if not registry.is_healthy(d)}


def test_everything_is_healthy_at_first() -> None:
    registry = HealthRegistry()
    assert registry.unhealthy() == {}
    assert unhealthy_ids(registry) == set()


def test_an_unhealthy_gpu_takes_down_its_replicas_and_mig_devices_in_every_resource() -> None:
    registry = HealthRegistry()
    assert registry.mark(HealthChange(GPU0, healthy=False, cause=xid(79)))
    assert unhealthy_ids(registry) == {
        GPU0,
        *(replica_id(m, r) for m in (MIG0_0, MIG0_1) for r in range(3)),
    }
    assert registry.reason(mig_device(MIG0_1, GPU0, 0, 1, 2)) == "XID 79"
    assert registry.reason(gpu_device(GPU1, 1, 0)) is None


def test_an_unhealthy_mig_device_affects_only_itself_and_its_replicas() -> None:
    registry = HealthRegistry()
    registry.mark(HealthChange(MIG0_1, healthy=False, cause=xid(94)))
    assert unhealthy_ids(registry) == {replica_id(MIG0_1, r) for r in range(3)}
    assert registry.is_healthy(gpu_device(GPU0, 0))


def test_a_fixed_set_of_unhealthy_uuids_follows_the_same_rule_as_the_registry() -> None:
    registry = HealthRegistry()
    for uuid in (GPU0, MIG0_1):
        registry.mark(HealthChange(uuid, healthy=False, cause=xid(79)))
    fixed = UnhealthyIds(frozenset({GPU0, MIG0_1}))
    devices = [d for plan in plans() for d in plan.devices]
    assert [fixed.is_healthy(d) for d in devices] == [registry.is_healthy(d) for d in devices]


def test_allocate_asks_the_registry() -> None:
    registry = HealthRegistry()
    mig_plan = AllocationIndex(plans()[0], Inventory(gpus=()))  # no device specs: no GPU facts read
    request = [[replica_id(MIG0_0, 1)]]
    assert allocate(mig_plan, request, AllocationSettings.from_config(Config()), registry).container_responses
    registry.mark(HealthChange(GPU0, healthy=False, cause=xid(79)))  # its GPU goes down
    with pytest.raises(AllocationError, match=rf"device '{replica_id(MIG0_0, 1)}' is unhealthy"):
        allocate(mig_plan, request, AllocationSettings.from_config(Config()), registry)
    registry.mark(HealthChange(GPU0, healthy=True, cause=RECOVERED))
    assert allocate(mig_plan, request, AllocationSettings.from_config(Config()), registry).container_responses


def test_gpu_reason_wins_over_its_mig_devices_reason() -> None:
    registry = HealthRegistry()
    registry.mark(HealthChange(MIG0_0, healthy=False, cause=xid(94)))
    registry.mark(HealthChange(GPU0, healthy=False, cause=LOST))
    assert registry.reason(mig_device(MIG0_0, GPU0, 0, 0)) == "GPU lost"
    registry.mark(HealthChange(GPU0, healthy=True, cause=RECOVERED))
    assert registry.reason(mig_device(MIG0_0, GPU0, 0, 0)) == "XID 94"


def test_mark_reports_only_real_changes_and_keeps_the_first_reason() -> None:
    registry = HealthRegistry()
    assert not registry.mark(HealthChange(GPU1, healthy=True, cause=RECOVERED))
    assert registry.mark(HealthChange(GPU1, healthy=False, cause=xid(48)))
    assert not registry.mark(HealthChange(GPU1, healthy=False, cause=xid(79)))
    assert registry.unhealthy() == {GPU1: "XID 48"}
    assert registry.mark(HealthChange(GPU1, healthy=True, cause=RECOVERED))
    assert registry.unhealthy() == {}


def test_subscribers_are_pushed_each_change_once_and_can_unsubscribe() -> None:
    registry = HealthRegistry()
    seen: list[HealthChange] = []
    unsubscribe = registry.subscribe(seen.append)
    down = HealthChange(GPU0, healthy=False, cause=xid(79))
    registry.mark(down)
    registry.mark(down)
    up = HealthChange(GPU0, healthy=True, cause=RECOVERED)
    registry.mark(up)
    assert seen == [down, up]
    unsubscribe()
    unsubscribe()
    registry.mark(down)
    assert seen == [down, up]


def test_subscribers_may_read_the_registry_and_a_failing_one_does_not_stop_the_others() -> None:
    registry = HealthRegistry()
    read_back: list[dict[str, str]] = []

    def broken(change: HealthChange) -> None:
        raise RuntimeError("listener bug")

    registry.subscribe(broken)
    registry.subscribe(lambda change: read_back.append(registry.unhealthy()))
    assert registry.mark(HealthChange(GPU1, healthy=False, cause=xid(48)))
    assert read_back == [{GPU1: "XID 48"}]


def test_concurrent_marks_end_consistent_with_notifications() -> None:
    registry = HealthRegistry()
    flips: list[HealthChange] = []
    registry.subscribe(flips.append)
    uuids = [f"GPU-{i:08d}" for i in range(8)]

    def hammer(seed: int) -> None:
        for n in range(500):
            uuid = uuids[(seed + n) % len(uuids)]
            registry.mark(HealthChange(uuid, healthy=(n + seed) % 3 == 0, cause=xid(79)))

    threads = [threading.Thread(target=hammer, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Replaying the notifications in delivery order must give the final state.
    replay: set[str] = set()
    for change in flips:
        assert (change.uuid in replay) == change.healthy  # each one is a real flip
        if change.healthy:
            replay.discard(change.uuid)
        else:
            replay.add(change.uuid)
    assert replay == set(registry.unhealthy())


def test_the_registry_keeps_the_typed_cause_that_first_took_a_device_down_and_since_when() -> None:
    from datetime import UTC, datetime

    from nvidia_device_plugin.health.policy import stuck_cause

    moments = iter([datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)])
    registry = HealthRegistry(wall_clock=lambda: next(moments))
    assert registry.mark(HealthChange(GPU0, healthy=False, cause=stuck_cause("nvmlDeviceGetUUID")))
    assert not registry.mark(HealthChange(GPU0, healthy=False, cause=xid(79)))
    assert registry.mark(HealthChange(GPU1, healthy=False, cause=xid(48)))
    verdicts = registry.verdicts()
    assert verdicts[GPU0].cause == HealthCause(CauseKind.NVML_STUCK, "NVML call nvmlDeviceGetUUID stuck")
    assert (verdicts[GPU1].cause.kind, verdicts[GPU1].cause.xid) == (CauseKind.XID, 48)
    assert [v.since.day for v in (verdicts[GPU0], verdicts[GPU1])] == [1, 2]
    assert registry.unhealthy() == {GPU0: "NVML call nvmlDeviceGetUUID stuck", GPU1: "XID 48"}

"""Property: any inventory and config advertise cleanly or fail with a project error."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, reject, settings
from hypothesis import strategies as st

from nvidia_device_plugin.base.errors import ConfigError, InventoryError
from nvidia_device_plugin.config.v1 import Config, ReplicatedDevices
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.plans.mig_layout import mig_layout_violations
from nvidia_device_plugin.plans.resource_plans import build_resources
from nvidia_device_plugin.plans.resources import physical_uuid_of

from support.checks import assert_all
from support.inventories import (
    A100,
    GPU,
    H100,
    T4,
    config,
    count,
    entry,
    gpu_uuid,
    make_gpu,
    mig_uuid,
    node,
    refs,
    share,
)

# --- property: anything either advertises cleanly or fails with a project error --------------------------

PROFILES = ["1g.10gb", "2g.20gb", "3g.40gb", "1g.10gb+me"]
# Weighted towards names the drawn nodes have, so that most examples do share something.
NAMES = [
    GPU,
    GPU,
    GPU,
    "nvidia.com/a100",
    "nvidia.com/h100",
    "nvidia.com/mig-1g.10gb",
    "nvidia.com/mig-small",
]


@st.composite
def inventories(draw: st.DrawFn) -> Inventory:
    gpus = []
    for index in range(draw(st.integers(0, 4))):
        mig_mode = draw(st.sampled_from([False, False, True]))
        mig = draw(st.lists(st.sampled_from(PROFILES), max_size=3)) if mig_mode else None
        gpus.append(
            make_gpu(
                index,
                draw(st.sampled_from([A100, H100, T4])),
                numa=draw(st.sampled_from([None, 0, 1])),
                mig=mig,
            )
        )
    return node(*gpus)


@st.composite
def device_selections(draw: st.DrawFn) -> ReplicatedDevices:
    kind = draw(st.sampled_from(["all", "count", "refs"]))
    if kind == "all":
        return ReplicatedDevices()
    if kind == "count":
        return count(draw(st.integers(1, 4)))
    choices = ["0", "1", "3", "0:0", "1:1", "0:2", gpu_uuid(0), gpu_uuid(2), mig_uuid(0, 0), mig_uuid(1, 0)]
    return refs(*draw(st.lists(st.sampled_from(choices), min_size=1, max_size=3)))


@st.composite
def configs(draw: st.DrawFn) -> Config:
    gpu_patterns = draw(
        st.lists(
            st.sampled_from([("*A100*", "nvidia.com/a100"), ("*H100*", "nvidia.com/h100"), ("T4", GPU)]),
            max_size=2,
        )
    )
    mig_patterns = draw(
        st.lists(st.sampled_from([("1g", "nvidia.com/mig-small"), ("3g.40gb", GPU)]), max_size=2)
    )
    entries = draw(
        st.lists(
            st.builds(
                entry,
                name=st.sampled_from(NAMES),
                replicas=st.integers(1, 3),
                rename=st.sampled_from([None, None, "nvidia.com/shared", GPU]),
                devices=device_selections(),
            ),
            min_size=1,
            max_size=2,
        )
    )
    try:
        sharing = share(*entries, rename_by_default=draw(st.booleans()), fail=draw(st.booleans()))
    except ConfigError as error:  # two replica counts under one name: the v1 types refuse it
        assert str(error)
        reject()
    mode = draw(st.sampled_from(["time-slicing", "time-slicing", "mps"]))
    return config(
        mig=draw(st.sampled_from(["none", "single", "mixed"])),
        gpus=gpu_patterns,
        migs=mig_patterns,
        time_slicing=sharing if mode == "time-slicing" else None,
        mps=sharing if mode == "mps" else None,
    )


def _expected_physical(inventory: Inventory, strategy: str) -> set[str]:
    out: set[str] = set()
    for gpu in inventory.gpus:
        if gpu.mig_enabled and strategy != "none":
            out.update(mig.uuid for mig in gpu.mig_devices)
        else:
            out.add(gpu.uuid)
    return out


@settings(max_examples=400, deadline=None)
@given(inventory=inventories(), cfg=configs())
def test_any_inventory_and_config_advertise_cleanly_or_fail_clearly(
    inventory: Inventory, cfg: Config
) -> None:
    try:
        plans = build_resources(inventory, cfg)
    except (InventoryError, ConfigError) as error:
        assert str(error)
        return
    known = {gpu.uuid: gpu for gpu in inventory.gpus}
    known_migs = {mig.uuid: (gpu, mig) for gpu in inventory.gpus for mig in gpu.mig_devices}
    assert [p.name for p in plans] == sorted({p.name for p in plans})
    assert len({p.socket_name for p in plans}) == len(plans)
    ids_per_physical: Counter[str] = Counter()
    plans_per_physical: dict[str, set[str]] = {}
    for plan in plans:
        assert plan.devices
        ids = [dev.id for dev in plan.devices]
        assert len(ids) == len(set(ids))
        for dev in plan.devices:
            assert physical_uuid_of(dev.id) == dev.physical_uuid
            assert (dev.replica is None) == (dev.id == dev.physical_uuid)
            if dev.kind == "gpu":
                gpu = known[dev.physical_uuid]
                assert (dev.gpu_uuid, dev.mig_index, dev.memory_bytes) == (gpu.uuid, None, gpu.memory_bytes)
            else:
                gpu, mig = known_migs[dev.physical_uuid]
                assert (dev.gpu_uuid, dev.mig_index, dev.memory_bytes) == (
                    gpu.uuid,
                    mig.index,
                    mig.memory_bytes,
                )
            assert (dev.gpu_index, dev.numa_node) == (gpu.index, gpu.numa_node)
            ids_per_physical[dev.physical_uuid] += 1
            plans_per_physical.setdefault(dev.physical_uuid, set()).add(plan.name)
        if plan.sharing != "none":
            assert plan.sharing == cfg.sharing.strategy
            assert any(dev.replica is not None for dev in plan.devices)
    # Every physical device is advertised, in exactly one resource, once or `replicas` times.
    left_out = {v.gpu_index for v in mig_layout_violations(inventory.gpus, cfg.flags.mig_strategy)}
    served = replace(inventory, gpus=tuple(g for g in inventory.gpus if g.index not in left_out))
    assert set(ids_per_physical) == _expected_physical(served, cfg.flags.mig_strategy)
    if not ids_per_physical:  # nothing to serve (as expected, just above): explicit, not vacuous
        assert plans_per_physical == {}
    else:
        assert_all(plans_per_physical.values(), lambda names: len(names) == 1)
    replicas = {p.name: p.replicas for p in plans}
    for uuid, n in ids_per_physical.items():
        (name,) = plans_per_physical[uuid]
        assert n in (1, replicas[name])

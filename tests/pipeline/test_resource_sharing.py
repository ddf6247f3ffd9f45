"""Inventory + config -> advertised resources: time-slicing, MPS, and config the node cannot resolve."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nvidia_device_plugin.base.errors import ConfigError, InventoryError
from nvidia_device_plugin.config.v1 import Config, ReplicatedDevices, ReplicatedResources
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.plans.resource_plans import build_resources
from nvidia_device_plugin.plans.resources import physical_uuid_of, replica_id

from support.inventories import (
    GIB,
    GPU,
    a100_h100,
    config,
    count,
    dgx_a100,
    entry,
    gpu_uuid,
    layout,
    mig_mixed_a100,
    mig_uniform_a100,
    mig_uuid,
    plan_named,
    refs,
    share,
    single_t4,
)

# --- time-slicing ---------------------------------------------------------------------------------------


def test_time_slicing_all_gpus() -> None:
    plans = build_resources(dgx_a100(), config(time_slicing=share(entry(replicas=4), fail=True)))
    (plan,) = plans
    assert (plan.name, plan.sharing, plan.replicas, plan.fail_requests_greater_than_one) == (
        GPU,
        "time-slicing",
        4,
        True,
    )
    assert [dev.id for dev in plan.devices] == [
        replica_id(gpu_uuid(g), r) for g in range(8) for r in range(4)
    ]
    assert [dev.id for dev in plan.devices][:2] == [f"{gpu_uuid(0)}::0", f"{gpu_uuid(0)}::1"]
    for dev in plan.devices:
        assert physical_uuid_of(dev.id) == dev.physical_uuid == dev.gpu_uuid
        assert dev.memory_bytes == 80 * GIB
        assert dev.numa_node == dev.gpu_index // 4
    assert len({dev.id for dev in plan.devices}) == 32


@pytest.mark.parametrize(
    ("sharing", "expected_name"),
    [
        (share(entry(rename="nvidia.com/gpu-shared")), "nvidia.com/gpu-shared"),
        (share(entry(), rename_by_default=True), "nvidia.com/gpu.shared"),
        (share(entry(rename="nvidia.com/gpu-shared"), rename_by_default=True), "nvidia.com/gpu-shared"),
        (share(entry()), GPU),
    ],
)
def test_time_slicing_rename(sharing: ReplicatedResources, expected_name: str) -> None:
    plans = build_resources(single_t4(), config(time_slicing=sharing))
    assert layout(plans) == {expected_name: ["0#0", "0#1"]}
    assert plans[0].sharing == "time-slicing"


@pytest.mark.parametrize(
    ("devices", "shared"),
    [
        (refs("0", "3"), ["0", "3"]),
        (refs("3", "0", "3"), ["0", "3"]),  # order and repeats do not matter
        (refs(gpu_uuid(5)), ["5"]),
        (refs("2", gpu_uuid(6)), ["2", "6"]),
        (count(2), ["0", "1"]),  # the first `count` by GPU index
        (count(8), [str(i) for i in range(8)]),
        (ReplicatedDevices(all=True), [str(i) for i in range(8)]),
    ],
)
def test_time_slicing_device_subsets(devices: ReplicatedDevices, shared: list[str]) -> None:
    renamed = build_resources(
        dgx_a100(), config(time_slicing=share(entry(rename="nvidia.com/gpu.shared", devices=devices)))
    )
    unshared = [str(i) for i in range(8) if str(i) not in shared]
    expected = {"nvidia.com/gpu.shared": [f"{g}#{r}" for g in shared for r in (0, 1)]}
    if unshared:
        expected[GPU] = unshared
    assert layout(renamed) == expected
    if unshared:
        assert plan_named(renamed, GPU).sharing == "none"
        assert plan_named(renamed, GPU).replicas == 1

    # Without a rename, the shared and unshared devices are one resource (as NVIDIA advertises them).
    same_name = build_resources(dgx_a100(), config(time_slicing=share(entry(devices=devices))))
    assert layout(same_name) == {
        GPU: [f"{i}#{r}" for i in range(8) for r in (0, 1)] if not unshared else _merged(shared, unshared)
    }
    assert same_name[0].sharing == "time-slicing"
    assert same_name[0].replicas == 2


def _merged(shared: list[str], unshared: list[str]) -> list[str]:
    out = [(int(g), r, f"{g}#{r}") for g in shared for r in (0, 1)] + [(int(g), -1, g) for g in unshared]
    return [name for *_, name in sorted(out)]


def test_two_entries_share_disjoint_devices_of_one_resource() -> None:
    sharing = share(
        entry(rename="nvidia.com/gpu-light", replicas=2, devices=refs("0")),
        entry(rename="nvidia.com/gpu-heavy", replicas=4, devices=refs("1")),
    )
    plans = build_resources(a100_h100(), config(time_slicing=sharing))
    assert layout(plans) == {
        GPU: ["2", "3"],
        "nvidia.com/gpu-heavy": ["1#0", "1#1", "1#2", "1#3"],
        "nvidia.com/gpu-light": ["0#0", "0#1"],
    }
    assert [(p.name, p.replicas) for p in plans] == [
        (GPU, 1),
        ("nvidia.com/gpu-heavy", 4),
        ("nvidia.com/gpu-light", 2),
    ]


def test_two_entries_with_one_rename_and_one_count_merge() -> None:
    sharing = share(
        entry(rename="nvidia.com/gpu.shared", devices=refs("2")),
        entry(rename="nvidia.com/gpu.shared", devices=refs("0")),
    )
    assert layout(build_resources(a100_h100(), config(time_slicing=sharing))) == {
        GPU: ["1", "3"],
        "nvidia.com/gpu.shared": ["0#0", "0#1", "2#0", "2#1"],
    }


def test_time_slicing_per_model_after_renames() -> None:
    cfg = config(
        gpus=[("*A100*", "nvidia.com/a100"), ("*H100*", "nvidia.com/h100")],
        time_slicing=share(entry("nvidia.com/h100", replicas=3), rename_by_default=True),
    )
    plans = build_resources(a100_h100(), cfg)
    assert layout(plans) == {
        "nvidia.com/a100": ["0", "1"],
        "nvidia.com/h100.shared": ["2#0", "2#1", "2#2", "3#0", "3#1", "3#2"],
    }
    assert plan_named(plans, "nvidia.com/h100.shared").sharing == "time-slicing"
    assert plan_named(plans, "nvidia.com/a100").sharing == "none"


def test_an_entry_for_a_resource_this_node_lacks_is_skipped() -> None:
    # One ConfigMap for a heterogeneous cluster: the A100 entry means nothing on a T4 node.
    cfg = config(
        gpus=[("*A100*", "nvidia.com/a100")],
        time_slicing=share(entry("nvidia.com/a100", devices=refs("0", "1", "7")), entry(GPU, replicas=3)),
    )
    assert layout(build_resources(single_t4(), cfg)) == {GPU: ["0#0", "0#1", "0#2"]}


def test_time_slicing_a_mig_resource() -> None:
    cfg = config(
        mig="mixed",
        time_slicing=share(entry("nvidia.com/mig-3g.40gb", replicas=2, devices=refs("0:3", mig_uuid(1, 1)))),
    )
    plans = build_resources(mig_mixed_a100(), cfg)
    assert layout(plans)["nvidia.com/mig-3g.40gb"] == ["0:3#0", "0:3#1", "1:0", "1:1#0", "1:1#1"]
    plan = plan_named(plans, "nvidia.com/mig-3g.40gb")
    shared = [dev for dev in plan.devices if dev.replica is not None]
    assert {physical_uuid_of(dev.id) for dev in shared} == {mig_uuid(0, 3), mig_uuid(1, 1)}
    assert {(dev.kind, dev.memory_bytes) for dev in plan.devices} == {("mig", 40 * GIB)}
    assert plan_named(plans, "nvidia.com/mig-1g.10gb").sharing == "none"


def test_time_slicing_under_single_strategy_shares_mig_devices() -> None:
    cfg = config(mig="single", time_slicing=share(entry(replicas=2, devices=count(3))))
    plans = build_resources(mig_uniform_a100(), cfg)
    assert layout(plans)[GPU][:8] == ["0:0#0", "0:0#1", "0:1#0", "0:1#1", "0:2#0", "0:2#1", "0:3", "0:4"]


def test_legacy_mig_names_in_device_lists() -> None:
    legacy = f"MIG-{gpu_uuid(1)}/2/0"  # GPU instance 2 on GPU 1 is MIG device 1:1 in these nodes
    cfg = config(mig="mixed", time_slicing=share(entry("nvidia.com/mig-3g.40gb", devices=refs(legacy))))
    assert layout(build_resources(mig_mixed_a100(), cfg))["nvidia.com/mig-3g.40gb"] == [
        "0:3",
        "1:0",
        "1:1#0",
        "1:1#1",
    ]


# --- MPS ------------------------------------------------------------------------------------------------


def test_mps_shares_whole_gpus() -> None:
    cfg = config(mps=share(entry(replicas=3), fail=True))
    (plan,) = build_resources(a100_h100(), cfg)
    assert (plan.sharing, plan.replicas, plan.fail_requests_greater_than_one) == ("mps", 3, True)
    assert len(plan.devices) == 12


def test_mps_wins_over_time_slicing() -> None:
    cfg = config(
        time_slicing=share(entry(replicas=8)), mps=share(entry(replicas=2, rename="nvidia.com/gpu-mps"))
    )
    assert layout(build_resources(single_t4(), cfg)) == {"nvidia.com/gpu-mps": ["0#0", "0#1"]}


def test_mps_on_mig_devices_is_refused() -> None:
    cfg = config(mig="mixed", mps=share(entry("nvidia.com/mig-1g.10gb", replicas=2)))
    with pytest.raises(InventoryError) as raised:
        build_resources(mig_mixed_a100(), cfg)
    assert "sharing.mps.resources[0]" in str(raised.value)
    assert f"MIG device 0:0 ({mig_uuid(0, 0)}) on GPU 0 ({gpu_uuid(0)})" in str(raised.value)
    assert "not supported for MIG" in str(raised.value)


def test_mps_on_a_resource_that_also_holds_mig_devices_is_refused() -> None:
    cfg = config(
        mig="mixed", migs=[("*", GPU)], mps=share(entry(GPU, replicas=2, devices=refs("2")))
    )  # MIG devices pooled under nvidia.com/gpu next to the whole GPU 2
    with pytest.raises(InventoryError, match="also holds MIG device 0:0"):
        build_resources(mig_mixed_a100(), cfg)


def test_mps_leaves_unshared_mig_resources_alone() -> None:
    cfg = config(mig="mixed", mps=share(entry(GPU, replicas=2)))
    plans = build_resources(mig_mixed_a100(), cfg)
    assert layout(plans)[GPU] == ["2#0", "2#1"]
    assert plan_named(plans, "nvidia.com/mig-3g.40gb").sharing == "none"


# --- config that does not resolve on this node -------------------------------------------------------------


@pytest.mark.parametrize(
    ("make_node", "cfg", "error", "fragments"),
    [
        (
            dgx_a100,
            config(time_slicing=share(entry(devices=refs("0", "9")))),
            ConfigError,
            ["sharing.timeSlicing.resources[0].devices[1] = '9' matches no device", "nvidia.com/gpu has 0 ("],
        ),
        (
            dgx_a100,
            config(mps=share(entry(devices=refs("GPU-ffffffff-1111-4222-8333-000000000000")))),
            ConfigError,
            ["sharing.mps.resources[0].devices[0] = 'GPU-ffffffff-1111-4222-8333-000000000000' matches no"],
        ),
        (
            a100_h100,
            config(
                gpus=[("*A100*", "nvidia.com/a100"), ("*H100*", "nvidia.com/h100")],
                time_slicing=share(entry("nvidia.com/a100", devices=refs("2"))),
            ),
            ConfigError,
            [f"devices[0] = '2' is GPU 2 ({gpu_uuid(2)}), which this node advertises as nvidia.com/h100"],
        ),
        (
            mig_mixed_a100,
            config(mig="mixed", time_slicing=share(entry("nvidia.com/mig-1g.10gb", devices=refs("0:2")))),
            ConfigError,
            ["'0:2' is MIG device 0:2", "advertises as nvidia.com/mig-2g.20gb, not nvidia.com/mig-1g.10gb"],
        ),
        (
            mig_mixed_a100,
            config(mig="mixed", time_slicing=share(entry("nvidia.com/mig-1g.10gb", devices=refs("0")))),
            ConfigError,
            [f"'0' is GPU 0 ({gpu_uuid(0)}), which is in MIG mode", "'0:<n>'"],
        ),
        (
            dgx_a100,
            config(time_slicing=share(entry(devices=count(9)))),
            ConfigError,
            ["sharing.timeSlicing.resources[0].devices asks to share 9 devices of nvidia.com/gpu", "has 8"],
        ),
        (
            dgx_a100,
            config(time_slicing=share(entry(devices=refs("1", "2")), entry(replicas=2, devices=refs("2")))),
            ConfigError,
            [
                f"resources[1].devices selects GPU 2 ({gpu_uuid(2)})",
                "sharing.timeSlicing.resources[0] already shares",
            ],
        ),
        (
            a100_h100,
            config(
                gpus=[("*A100*", "nvidia.com/a100")],
                time_slicing=share(entry("nvidia.com/a100", rename=GPU)),
            ),
            ConfigError,
            [
                "nvidia.com/gpu would hold devices of both nvidia.com/a100",
                "(sharing.timeSlicing.resources[0]) and nvidia.com/gpu (its unshared devices)",
            ],
        ),
    ],
)
def test_config_errors_name_the_field_and_the_device(
    make_node: Callable[[], Inventory], cfg: Config, error: type[Exception], fragments: list[str]
) -> None:
    with pytest.raises(error) as raised:
        build_resources(make_node(), cfg)
    for fragment in fragments:
        assert fragment in str(raised.value)


# Values no config may hold are refused where they are built, by the v1 types (tests/config shows the
# same refusals at their document paths); build_resources never sees them.


@pytest.mark.parametrize(
    ("build", "fragments"),
    [
        (lambda: entry(replicas=0), ["replicas must be >= 1, got 0"]),
        (lambda: ReplicatedDevices(all=False), ["devices: the device list is empty"]),
        (lambda: count(0), ["devices: a device count must be > 0, got 0"]),
        (
            lambda: share(entry(replicas=2, devices=refs("1")), entry(replicas=4, devices=refs("2"))),
            [
                "resources[1].replicas: 'nvidia.com/gpu' is also advertised by resources[0] with 2 replicas",
                "one replica count, got 4",
            ],
        ),
    ],
)
def test_values_no_config_may_hold_are_refused_by_the_v1_types(
    build: Callable[[], object], fragments: list[str]
) -> None:
    with pytest.raises(ConfigError) as raised:
        build()
    for fragment in fragments:
        assert fragment in str(raised.value)


def test_renaming_onto_a_resource_with_no_devices_left_is_allowed() -> None:
    # All GPUs of nvidia.com/gpu are shared away, so the name is free for nothing else to collide with.
    cfg = config(time_slicing=share(entry(rename="nvidia.com/gpu.shared")))
    assert [p.name for p in build_resources(a100_h100(), cfg)] == ["nvidia.com/gpu.shared"]

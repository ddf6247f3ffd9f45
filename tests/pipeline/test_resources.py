"""Inventory + config -> advertised resources: MIG strategies, renames, sharing, and the errors."""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from nvidia_device_plugin.config.v1 import (
    Config,
    ReplicatedDevices,
    ReplicatedResources,
)
from nvidia_device_plugin.devices import Gpu, Inventory
from nvidia_device_plugin.errors import ConfigError, InventoryError
from nvidia_device_plugin.mig_layout import mig_layout_violations
from nvidia_device_plugin.resource_plans import build_resources
from nvidia_device_plugin.resources import (
    default_mig_resource_name,
    physical_uuid_of,
    replica_id,
    resource_pattern_matches,
)

from support.inventories import (
    A100,
    GIB,
    GPU,
    H100,
    T4,
    a100_h100,
    config,
    count,
    dgx_a100,
    empty_node,
    entry,
    gpu_uuid,
    layout,
    make_gpu,
    mig_mixed_a100,
    mig_two_profiles,
    mig_uniform_a100,
    mig_uuid,
    mig_without_devices,
    node,
    plan_named,
    refs,
    share,
    single_t4,
)

# --- patterns and names --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("*", A100, True),
        ("", A100, False),  # anchored: an empty pattern matches only an empty name
        ("A100", A100, False),  # no `*`: the whole name, not a substring
        ("NVIDIA A100-SXM4-80GB", A100, True),
        ("*A100*", A100, True),
        ("NVIDIA*80GB", A100, True),
        ("NVIDIA*40GB", A100, False),
        ("a100", A100, False),  # case-sensitive
        ("A1.0", A100, False),  # "." is literal
        ("A100-SXM4-80GB+", A100, False),  # "+" is literal
        ("T4", T4, False),
        ("*T4", T4, True),
        ("H100", A100, False),
        ("1g.10gb", "1g.10gb+me", False),  # NVIDIA v0.20: 1g.10gb+me has a resource of its own
        ("1g.10gb+me", "1g.10gb+me", True),
        ("3g.40gb", "1c.3g.40gb", False),
    ],
)
def test_pattern_matching_is_nvidias_anchored_glob(pattern: str, name: str, matches: bool) -> None:
    assert resource_pattern_matches(pattern, name) is matches


@pytest.mark.parametrize(
    ("profile", "resource"),
    [
        ("1g.10gb", "nvidia.com/mig-1g.10gb"),
        ("7g.80gb", "nvidia.com/mig-7g.80gb"),
        ("1g.10gb+me", "nvidia.com/mig-1g.10gb.me"),
        ("1c.3g.40gb", "nvidia.com/mig-3g.40gb"),
    ],
)
def test_default_mig_resource_name(profile: str, resource: str) -> None:
    assert default_mig_resource_name(profile) == resource


# --- MIG strategies on every kind of node ------------------------------------------------------------------

ALL_WHOLE_8 = {GPU: [str(i) for i in range(8)]}


@pytest.mark.parametrize(
    ("make_node", "strategy", "expected"),
    [
        (dgx_a100, "none", ALL_WHOLE_8),
        (dgx_a100, "single", ALL_WHOLE_8),
        (dgx_a100, "mixed", ALL_WHOLE_8),
        (single_t4, "none", {GPU: ["0"]}),
        (single_t4, "single", {GPU: ["0"]}),
        (single_t4, "mixed", {GPU: ["0"]}),
        (a100_h100, "none", {GPU: ["0", "1", "2", "3"]}),
        (a100_h100, "mixed", {GPU: ["0", "1", "2", "3"]}),
        (empty_node, "none", {}),
        (empty_node, "single", {}),
        (empty_node, "mixed", {}),
        # MIG mode is ignored under `none`: GPUs in MIG mode are advertised whole, as NVIDIA does.
        (mig_mixed_a100, "none", {GPU: ["0", "1", "2"]}),
        (mig_uniform_a100, "none", {GPU: ["0", "1"]}),
        (mig_without_devices, "none", {GPU: ["0", "1"]}),
        (
            mig_mixed_a100,
            "mixed",
            {
                GPU: ["2"],
                "nvidia.com/mig-1g.10gb": ["0:0", "0:1"],
                "nvidia.com/mig-2g.20gb": ["0:2"],
                "nvidia.com/mig-3g.40gb": ["0:3", "1:0", "1:1"],
            },
        ),
        (mig_uniform_a100, "single", {GPU: [f"{g}:{m}" for g in (0, 1) for m in range(7)]}),
        (
            mig_uniform_a100,
            "mixed",
            {"nvidia.com/mig-1g.10gb": [f"{g}:{m}" for g in (0, 1) for m in range(7)]},
        ),
        (
            mig_two_profiles,
            "mixed",
            {"nvidia.com/mig-1g.10gb": ["0:0", "0:1"], "nvidia.com/mig-2g.20gb": ["1:0"]},
        ),
    ],
)
def test_mig_strategy_layout(
    make_node: Callable[[], Inventory], strategy: str, expected: dict[str, list[str]]
) -> None:
    plans = build_resources(make_node(), config(mig=strategy))
    assert layout(plans) == expected
    assert all(plan.sharing == "none" and plan.replicas == 1 for plan in plans)


@pytest.mark.parametrize(
    ("make_node", "strategy", "served", "named"),
    [
        (mig_mixed_a100, "single", None, ["GPU 2", "is not in MIG mode while other GPUs are"]),
        (
            mig_two_profiles,
            "single",
            None,
            ["GPU 1", "has MIG profiles 2g.20gb where the node serves 1g.10gb"],
        ),
        (mig_without_devices, "single", None, ["GPU 1", "is in MIG mode but has no MIG devices"]),
        (mig_without_devices, "mixed", None, ["GPU 1", "is in MIG mode but has no MIG devices"]),
    ],
)
def test_gpus_breaking_the_mig_strategy_are_named_and_the_rest_served(
    make_node: Callable[[], Inventory], strategy: str, served: None, named: list[str]
) -> None:
    inventory = make_node()
    violations = mig_layout_violations(inventory.gpus, strategy)
    assert violations
    assert any(all(fragment in v.message for fragment in named) for v in violations)
    plans = build_resources(inventory, config(mig=strategy))
    advertised = {dev.gpu_index for plan in plans for dev in plan.devices}
    assert advertised and not advertised & {v.gpu_index for v in violations}
    # The pipeline computes the violations once and hands them over: the same plans.
    assert build_resources(inventory, config(mig=strategy), violations) == plans


def test_single_on_a_mixed_layout_names_every_gpu_it_leaves_out() -> None:
    messages = [v.message for v in mig_layout_violations(mig_mixed_a100().gpus, "single")]
    assert any("GPU 2" in m and "is not in MIG mode while other GPUs are" in m for m in messages)
    assert build_resources(mig_mixed_a100(), config(mig="single"))


def test_media_extension_profiles_get_their_own_resource() -> None:
    from nvidia_device_plugin.resources import default_mig_resource_name

    assert default_mig_resource_name("1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"
    assert default_mig_resource_name("1g.10gb+me.all") == "nvidia.com/mig-1g.10gb.me.all"
    assert default_mig_resource_name("1g.10gb-me") == "nvidia.com/mig-1g.10gb-me"


def test_whole_gpu_devices_carry_their_gpu() -> None:
    plans = build_resources(dgx_a100(), config())
    devices = plan_named(plans, GPU).devices
    assert [dev.id for dev in devices] == [gpu_uuid(i) for i in range(8)]
    assert [dev.numa_node for dev in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {(dev.kind, dev.mig_index, dev.replica, dev.memory_bytes) for dev in devices} == {
        ("gpu", None, None, 80 * GIB)
    }
    assert all(dev.physical_uuid == dev.gpu_uuid == dev.id for dev in devices)


def test_mig_devices_carry_the_slice_and_the_parent() -> None:
    plans = build_resources(mig_mixed_a100(), config(mig="mixed"))
    dev = plan_named(plans, "nvidia.com/mig-2g.20gb").devices[0]
    assert (dev.id, dev.physical_uuid, dev.gpu_uuid) == (mig_uuid(0, 2), mig_uuid(0, 2), gpu_uuid(0))
    assert (dev.kind, dev.gpu_index, dev.mig_index, dev.replica) == ("mig", 0, 2, None)
    assert dev.memory_bytes == 20 * GIB
    assert dev.numa_node == 0
    assert plan_named(plans, GPU).devices[0].numa_node == 1


def test_single_strategy_advertises_mig_uuids_as_gpus() -> None:
    plans = build_resources(mig_uniform_a100(), config(mig="single"))
    (plan,) = plans
    assert plan.name == GPU
    assert [dev.id for dev in plan.devices] == [mig_uuid(g, m) for g in (0, 1) for m in range(7)]
    assert {dev.kind for dev in plan.devices} == {"mig"}
    assert [dev.numa_node for dev in plan.devices] == [0] * 7 + [1] * 7


def test_none_strategy_advertises_a_mig_mode_gpu_by_its_gpu_uuid() -> None:
    plans = build_resources(mig_uniform_a100(), config(mig="none"))
    assert [(dev.id, dev.kind, dev.memory_bytes) for dev in plans[0].devices] == [
        (gpu_uuid(0), "gpu", 80 * GIB),
        (gpu_uuid(1), "gpu", 80 * GIB),
    ]


# --- renames --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("patterns", "expected"),
    [
        (
            [("*A100*", "nvidia.com/a100"), ("*H100*", "nvidia.com/h100")],
            {"nvidia.com/a100": ["0", "1"], "nvidia.com/h100": ["2", "3"]},
        ),
        # unmatched GPUs keep nvidia.com/gpu
        ([("*H100*", "nvidia.com/h100")], {GPU: ["0", "1"], "nvidia.com/h100": ["2", "3"]}),
        # the first matching pattern wins
        (
            [("NVIDIA*", "nvidia.com/any"), ("*A100*", "nvidia.com/a100")],
            {"nvidia.com/any": ["0", "1", "2", "3"]},
        ),
        (
            [("*A100*", "nvidia.com/a100"), ("NVIDIA*", "nvidia.com/any")],
            {"nvidia.com/a100": ["0", "1"], "nvidia.com/any": ["2", "3"]},
        ),
        # patterns are case-sensitive substrings: no match, defaults apply
        ([("a100", "nvidia.com/a100")], {GPU: ["0", "1", "2", "3"]}),
        # resources on other domains are fine, and get their own socket
        ([("*H100*", "example.com/h100")], {GPU: ["0", "1"], "example.com/h100": ["2", "3"]}),
    ],
)
def test_gpu_renames_on_a_mixed_a100_h100_node(
    patterns: list[tuple[str, str]], expected: dict[str, list[str]]
) -> None:
    assert layout(build_resources(a100_h100(), config(gpus=patterns))) == expected


def test_gpu_renames_carry_numa_per_model() -> None:
    plans = build_resources(
        a100_h100(), config(gpus=[("*A100*", "nvidia.com/a100"), ("*H100*", "nvidia.com/h100")])
    )
    assert {plan.name: {dev.numa_node for dev in plan.devices} for plan in plans} == {
        "nvidia.com/a100": {0},
        "nvidia.com/h100": {1},
    }


def test_a_t4_not_matching_an_a100_pattern_keeps_the_default_name() -> None:
    assert layout(build_resources(single_t4(), config(gpus=[("*A100*", "nvidia.com/a100")]))) == {GPU: ["0"]}


def test_mig_renames_under_mixed() -> None:
    plans = build_resources(mig_mixed_a100(), config(mig="mixed", migs=[("1g.10gb", "nvidia.com/mig-small")]))
    assert layout(plans) == {
        GPU: ["2"],
        "nvidia.com/mig-2g.20gb": ["0:2"],
        "nvidia.com/mig-3g.40gb": ["0:3", "1:0", "1:1"],
        "nvidia.com/mig-small": ["0:0", "0:1"],
    }


def test_mig_renames_pool_profiles_when_asked() -> None:
    plans = build_resources(mig_mixed_a100(), config(mig="mixed", migs=[("*g.*", "nvidia.com/mig-any")]))
    assert layout(plans) == {GPU: ["2"], "nvidia.com/mig-any": ["0:0", "0:1", "0:2", "0:3", "1:0", "1:1"]}


def test_mig_patterns_are_ignored_under_none_and_apply_under_single() -> None:
    patterns = [("1g.10gb", "nvidia.com/mig-small")]
    assert layout(build_resources(mig_uniform_a100(), config(mig="none", migs=patterns))) == {GPU: ["0", "1"]}
    single = build_resources(mig_uniform_a100(), config(mig="single", migs=patterns))
    assert [plan.name for plan in single] == ["nvidia.com/mig-small"]


def test_default_mig_resource_for_me_and_compute_instance_profiles() -> None:
    inventory = node(make_gpu(0, mig=["1g.10gb", "1g.10gb+me", "1c.3g.40gb"]))
    assert layout(build_resources(inventory, config(mig="mixed"))) == {
        "nvidia.com/mig-1g.10gb": ["0:0"],
        "nvidia.com/mig-1g.10gb.me": ["0:1"],
        "nvidia.com/mig-3g.40gb": ["0:2"],
    }


def test_names_that_share_a_socket_are_an_error() -> None:
    patterns = [("*A100*", "nvidia.com/fast"), ("*H100*", "fast")]
    with pytest.raises(ConfigError, match=r"fast and nvidia.com/fast .*socket nvidia-fast\.sock"):
        build_resources(a100_h100(), config(gpus=patterns))


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


# --- determinism and inventories that cannot be right ----------------------------------------------------


def test_result_does_not_depend_on_inventory_order() -> None:
    cfg = config(mig="mixed", time_slicing=share(entry("nvidia.com/mig-3g.40gb", replicas=3), entry(GPU)))
    inventory = mig_mixed_a100()
    shuffled = list(inventory.gpus)
    random.Random(7).shuffle(shuffled)
    reversed_migs = [Gpu(**{**g.__dict__, "mig_devices": tuple(reversed(g.mig_devices))}) for g in shuffled]
    expected = build_resources(inventory, cfg)
    assert build_resources(inventory, cfg) == expected
    assert build_resources(node(*shuffled), cfg) == expected
    assert build_resources(node(*reversed_migs), cfg) == expected
    assert [p.name for p in expected] == sorted(p.name for p in expected)


@pytest.mark.parametrize(
    ("inventory", "fragment"),
    [
        (node(make_gpu(0), make_gpu(0)), "GPU index 0 is reported twice"),
        (
            node(make_gpu(0), Gpu(**{**make_gpu(1).__dict__, "uuid": gpu_uuid(0)})),
            f"UUID {gpu_uuid(0)} is reported for both GPU 0",
        ),
    ],
)
def test_broken_inventories_are_refused(inventory: Inventory, fragment: str) -> None:
    with pytest.raises(InventoryError, match=re.escape(fragment)):
        build_resources(inventory, config())


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
    assert all(len(names) == 1 for names in plans_per_physical.values())
    replicas = {p.name: p.replicas for p in plans}
    for uuid, n in ids_per_physical.items():
        (name,) = plans_per_physical[uuid]
        assert n in (1, replicas[name])

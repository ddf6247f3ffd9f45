"""Inventory + config -> advertised resources: MIG strategies, renames, sharing, and the errors."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import pytest

from nvidia_device_plugin.base.errors import ConfigError, InventoryError
from nvidia_device_plugin.devices import Gpu, Inventory
from nvidia_device_plugin.plans.mig_layout import mig_layout_violations
from nvidia_device_plugin.plans.resource_plans import build_resources
from nvidia_device_plugin.plans.resources import default_mig_resource_name, resource_pattern_matches

from support.checks import assert_all
from support.inventories import (
    A100,
    GIB,
    GPU,
    T4,
    a100_h100,
    config,
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
    if not expected:  # a node without GPUs: no resource at all, said so rather than checked vacuously
        assert len(plans) == 0
    else:
        assert_all(plans, lambda plan: plan.sharing == "none" and plan.replicas == 1)


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
    from nvidia_device_plugin.plans.resources import default_mig_resource_name

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
    assert_all(devices, lambda dev: dev.physical_uuid == dev.gpu_uuid == dev.id)


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

"""Resource naming in the config: ignored by default with NVIDIA v0.20's warnings, applied when asked for.

NVIDIA v0.20's DisableResourceNamingInConfig (api/config/v1/config.go) drops `resources.gpus/mig`, and the
`rename` and `devices` of every `sharing.*.resources` entry, logging one warning per kind; a rename under
`renameByDefault: true` becomes `<name>.shared`. The expected texts below are NVIDIA's.
"""

from __future__ import annotations

import pytest

from nvidia_device_plugin.config.loader import Override, build_config, parse_config_text, parse_document_text
from nvidia_device_plugin.config.v1 import (
    Config,
    ReplicatedDevices,
    ReplicatedResource,
    ResourcePattern,
    Resources,
)
from nvidia_device_plugin.plans.resource_plans import build_resources

from support.inventories import mig_mixed_a100

NVIDIA_RESOURCES = "Customizing the 'resources' field is not yet supported in the config. Ignoring..."
NVIDIA_RENAME = (
    "Setting the 'rename' field in sharing.{}.resources is not yet supported in the config. Ignoring..."
)
NVIDIA_DEVICES = (
    "Customizing the 'devices' field in sharing.{}.resources is not yet supported in the config. Ignoring..."
)

V020_CONFIGMAP = """
version: v1
flags: {migStrategy: mixed}
resources:
  gpus: [{pattern: "*A100*", name: a100}]
  mig: [{pattern: "1g.10gb", name: mig-small}]
sharing:
  timeSlicing:
    resources:
    - {name: nvidia.com/gpu, replicas: 4, rename: gpu-ts, devices: [0, 1]}
    - {name: nvidia.com/mig-1g.10gb, replicas: 2, devices: 2}
"""


def ignored(config: Config) -> list[str]:
    return [w.message for w in config.warnings if w.kind == "ignored"]


def test_by_default_resources_renames_and_device_lists_are_dropped_with_nvidias_warnings() -> None:
    config = parse_config_text(V020_CONFIGMAP, "cm.yaml")
    assert config.resources == Resources()
    assert config.sharing.active.resources == (
        ReplicatedResource(name="nvidia.com/gpu", replicas=4),
        ReplicatedResource(name="nvidia.com/mig-1g.10gb", replicas=2),
    )
    assert ignored(config) == [
        f"cm.yaml: resources.gpus, resources.mig: {NVIDIA_RESOURCES} (NVIDIA v0.20 ignores it too; to apply "
        "it, set flags.resourceNaming: true (--resource-naming, NVDP_RESOURCE_NAMING=true))",
        f"cm.yaml: sharing.timeSlicing.resources[0].rename: {NVIDIA_RENAME.format('timeSlicing')} (NVIDIA "
        "v0.20 ignores it too; to apply it, set flags.resourceNaming: true (--resource-naming, "
        "NVDP_RESOURCE_NAMING=true))",
        "cm.yaml: sharing.timeSlicing.resources[0].devices, sharing.timeSlicing.resources[1].devices: "
        f"{NVIDIA_DEVICES.format('timeSlicing')} (NVIDIA v0.20 ignores it too; to apply it, set "
        "flags.resourceNaming: true (--resource-naming, NVDP_RESOURCE_NAMING=true))",
    ]


def test_a_v0_20_configmap_gives_nvidias_resource_names_and_counts() -> None:
    # The case: `*A100* -> a100` is nvidia.com/gpu on NVIDIA's plugin, so it must be here too.
    plans = build_resources(mig_mixed_a100(), parse_config_text(V020_CONFIGMAP))
    counts = {plan.name: len(plan.devices) for plan in plans}
    # GPU 2 whole (4 replicas), GPU 0's two 1g.10gb devices shared 2 ways each (`devices: 2` dropped), the
    # other profiles unshared under their default names.
    assert counts == {
        "nvidia.com/gpu": 4,
        "nvidia.com/mig-1g.10gb": 4,
        "nvidia.com/mig-2g.20gb": 1,
        "nvidia.com/mig-3g.40gb": 3,
    }
    named = build_resources(
        mig_mixed_a100(), parse_config_text(V020_CONFIGMAP.replace("mixed}", "mixed, resourceNaming: true}"))
    )
    # Renamed first, the devices no longer carry the names the sharing entries share (plan warns of it).
    assert [plan.name for plan in named] == [
        "nvidia.com/a100",
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-3g.40gb",
        "nvidia.com/mig-small",
    ]


def test_rename_by_default_stays_and_an_explicit_rename_becomes_the_shared_name() -> None:
    config = parse_config_text(
        "sharing: {mps: {renameByDefault: true, resources: [{name: gpu, replicas: 2, rename: gpu-mps}, ]}}"
    )
    (entry,) = config.sharing.active.resources
    assert entry.rename == "nvidia.com/gpu.shared"  # NVIDIA: r.Name.DefaultSharedRename()
    assert ignored(config) == [
        f"<config>: sharing.mps.resources[0].rename: {NVIDIA_RENAME.format('mps')} (NVIDIA v0.20 ignores it "
        "too; to apply it, set flags.resourceNaming: true (--resource-naming, NVDP_RESOURCE_NAMING=true))"
    ]


def test_rename_by_default_alone_and_devices_all_are_not_warned_about() -> None:
    config = parse_config_text(
        "sharing: {timeSlicing: {renameByDefault: true, resources: [{name: gpu, replicas: 2, devices: all},"
        " {name: mig-1g.10gb, replicas: 2, rename: nvidia.com/mig-1g.10gb.shared}]}}"
    )
    assert ignored(config) == []
    assert [e.rename for e in config.sharing.active.resources] == [
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-1g.10gb.shared",
    ]


@pytest.mark.parametrize(
    "override",
    [None, Override(True, "flag --resource-naming"), Override(True, "env NVDP_RESOURCE_NAMING")],
    ids=["file", "flag", "env"],
)
def test_resource_naming_applies_them(override: Override | None) -> None:
    text = (
        V020_CONFIGMAP
        if override is not None
        else V020_CONFIGMAP.replace("mixed}", "mixed, resourceNaming: true}")
    )
    overrides = {"flags.resourceNaming": override} if override is not None else {}
    config = build_config(parse_document_text(text), overrides, "cm.yaml")
    assert config.flags.resource_naming is True
    assert ignored(config) == []
    assert config.resources.gpus == (ResourcePattern("*A100*", "nvidia.com/a100"),)
    first, second = config.sharing.active.resources
    assert (first.rename, first.devices) == (
        "nvidia.com/gpu-ts",
        ReplicatedDevices(all=False, refs=("0", "1")),
    )
    assert second.devices == ReplicatedDevices(all=False, count=2)


def test_resource_naming_false_is_the_default_and_a_boolean() -> None:
    assert Config().flags.resource_naming is False
    assert parse_config_text("flags: {resourceNaming: false}").flags.resource_naming is False
    with pytest.raises(Exception, match=r"flags.resourceNaming must be a boolean, got 'yes please'"):
        parse_config_text("flags: {resourceNaming: yes please}")

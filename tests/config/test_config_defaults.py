"""config.loader: defaults and NVIDIA's semantics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.loader import (
    Override,
    build_config,
    load_config_file,
    parse_config,
    parse_go_duration,
    qualify_resource_name,
)
from nvidia_device_plugin.config.v1 import DEFAULT_IGNORED_XIDS, HEALTH_EVENT_TYPES, Config, ReplicatedDevices

from support.configs import parse


def parse_named(text: str) -> Config:
    """`text` with resource naming applied (flags.resourceNaming; NVIDIA v0.20 ignores renames and device
    selections, and so does the default here: tests/config/test_config_naming.py)."""
    return parse("flags: {resourceNaming: true}\n" + text)


# --------------------------------------------------------------------------------------------------------
# Defaults and NVIDIA's semantics


@pytest.mark.parametrize(
    "text", ["", "\n", "# only a comment\n", "---\n", "version: v1\n", "version: ''\n", "{}"]
)
def test_empty_documents_mean_all_defaults(text: str) -> None:
    assert parse(text) == Config()


def test_null_sections_mean_defaults() -> None:
    assert parse("flags:\nresources:\nsharing:\nhealth:\nimex:\n") == Config()
    assert parse("flags: {migStrategy: null, plugin: null}\n") == Config()


def test_dev_root_defaults_to_driver_root_as_nvidia_does() -> None:
    assert (
        parse("flags: {nvidiaDriverRoot: /run/nvidia/driver}").flags.nvidia_dev_root == "/run/nvidia/driver"
    )
    both = parse("flags: {nvidiaDriverRoot: /run/nvidia/driver, nvidiaDevRoot: /}")
    assert both.flags.nvidia_dev_root == "/"


def test_device_list_strategy_string_or_list() -> None:
    assert parse(
        "flags: {plugin: {deviceListStrategy: volume-mounts}}"
    ).flags.plugin.device_list_strategy == ("volume-mounts",)
    listed = parse("flags: {plugin: {deviceListStrategy: [cdi-cri, envvar, cdi-cri]}}")
    assert listed.flags.plugin.device_list_strategy == ("cdi-cri", "envvar")


def test_nvidia_cdi_hook_path_is_an_alias_of_nvidia_ctk_path() -> None:
    config = parse("flags: {plugin: {nvidiaCDIHookPath: /usr/bin/nvidia-cdi-hook}}")
    assert config.flags.plugin.nvidia_ctk_path == "/usr/bin/nvidia-cdi-hook"


def test_mps_fail_requests_default_can_be_relaxed_and_time_slicing_default_is_false() -> None:
    relaxed = parse(
        "sharing: {mps: {failRequestsGreaterThanOne: false, resources: [{name: gpu, replicas: 2}]}}"
    )
    assert relaxed.sharing.active.fail_requests_greater_than_one is False
    ts = parse("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}}")
    assert ts.sharing.active.fail_requests_greater_than_one is False


def test_names_are_prefixed_and_explicit_rename_beats_rename_by_default() -> None:
    config = parse_named(
        """
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
    - {name: gpu, replicas: 2, rename: gpu-shared}
    - {name: nvidia.com/mig-1g.10gb, replicas: 3}
"""
    )
    first, second = config.sharing.active.resources
    assert (first.name, first.rename) == ("nvidia.com/gpu", "nvidia.com/gpu-shared")
    assert (second.name, second.rename) == ("nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.10gb.shared")


def test_one_replica_is_accepted() -> None:
    config = parse("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 1}]}}")
    assert config.sharing.active.resources[0].replicas == 1


def test_devices_count_and_canonical_refs() -> None:
    counted = parse_named("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: 3}]}}")
    assert counted.sharing.active.resources[0].devices == ReplicatedDevices(all=False, count=3)
    refs = parse_named(
        "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, "
        "devices: ['007', '01:002', 'GPU-4CF8DB2D-06C0-7D70-1A51-E59B25B2C16C', 7]}]}}"
    )
    assert refs.sharing.active.resources[0].devices.refs == (
        "7",
        "1:2",
        "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",
    )


def test_entries_sharing_a_final_name_with_equal_replicas_are_accepted() -> None:
    config = parse_named(
        "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, rename: shared}, "
        "{name: mig-1g.10gb, replicas: 2, rename: shared}]}}"
    )
    assert {r.rename for r in config.sharing.active.resources} == {"nvidia.com/shared"}


def test_health_lists_replace_defaults_only_when_non_empty() -> None:
    assert parse("health: {ignoredXIDs: [79]}").health.ignored_xids == frozenset({79})
    assert parse("health: {ignoredXIDs: []}").health.ignored_xids == DEFAULT_IGNORED_XIDS
    assert parse("health: {eventTypes: []}").health.event_types == HEALTH_EVENT_TYPES
    assert parse("health: {criticalXIDs: ALL}").health.critical_xids is None


def test_health_recovery_extension() -> None:
    minutes = parse("health: {recovery: {enabled: true, gracePeriod: 2m}}").health.recovery
    assert (minutes.enabled, minutes.grace_period_seconds) == (True, 120.0)
    recovery = parse("health: {recovery: {gracePeriod: 45}}").health.recovery
    assert (recovery.enabled, recovery.grace_period_seconds) == (False, 45.0)
    assert parse("health: {recovery: {gracePeriod: 1.5}}").health.recovery.grace_period_seconds == 1.5


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("90s", 90.0),
        ("1m30s", 90.0),
        ("1.5h", 5400.0),
        ("300ms", 0.3),
        ("-2s", -2.0),
        ("1h1m1s", 3661.0),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "s", "1x", "1.s5", "m5", " 5s", "."])
def test_not_go_durations(text: str) -> None:
    assert parse_go_duration(text) is None


def test_json_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    doc = {"version": "v1", "flags": {"migStrategy": "single"}, "sharing": {"timeSlicing": {"resources": []}}}
    doc["sharing"]["timeSlicing"]["resources"] = [{"name": "nvidia.com/gpu", "replicas": 3}]  # type: ignore[index]
    path.write_text(json.dumps(doc, indent="\t"))  # tabs: valid JSON that YAML 1.1 refuses
    config = load_config_file(path)
    assert config.flags.mig_strategy == "single"
    assert config.sharing.active.resources[0].replicas == 3


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("version: v1\nflags:\n  migStrategy: [mixed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: invalid YAML at line 4"):
        load_config_file(path)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml: config file not found"):
        load_config_file(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config_file(tmp_path)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"version: v1\n\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config_file(binary)


def test_overrides_replace_file_values_and_errors_name_their_origin() -> None:
    file_doc = {"flags": {"migStrategy": "single", "plugin": {"nvidiaCDIHookPath": "/file/hook"}}}
    config = build_config(
        file_doc,
        {
            "flags.plugin.passDeviceSpecs": Override(True, "flag --pass-device-specs"),
            "flags.plugin.nvidiaCTKPath": Override("/env/ctk", "env NVIDIA_CTK_PATH"),
        },
        "file.yaml",
    )
    assert config.flags.mig_strategy == "single"
    assert config.flags.plugin.pass_device_specs is True
    assert config.flags.plugin.nvidia_ctk_path == "/env/ctk"  # the override beats the file's alias
    assert file_doc["flags"]["plugin"] == {
        "nvidiaCDIHookPath": "/file/hook"
    }  # the caller's document is untouched

    with pytest.raises(ConfigError) as err:
        build_config(None, {"flags.migStrategy": Override("mix", "env MIG_STRATEGY")}, "file.yaml")
    assert (
        str(err.value) == "env MIG_STRATEGY: flags.migStrategy must be one of none, single, mixed, got 'mix'"
    )

    with pytest.raises(ConfigError, match=r"^file\.yaml: flags\.failOnInitError"):
        build_config(
            {"flags": {"failOnInitError": "no"}},
            {"flags.migStrategy": Override("mixed", "env MIG_STRATEGY")},
            "file.yaml",
        )


def test_mps_with_mixed_from_the_environment_blames_the_environment() -> None:
    with pytest.raises(
        ConfigError, match=r"^env MIG_STRATEGY: flags\.migStrategy: 'mixed' cannot be combined"
    ):
        build_config(
            {"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2}]}}},
            {"flags.migStrategy": Override("mixed", "env MIG_STRATEGY")},
            "file.yaml",
        )


def test_qualify_resource_name() -> None:
    assert qualify_resource_name("mig-1g.10gb") == "nvidia.com/mig-1g.10gb"
    assert qualify_resource_name("nvidia.com/gpu") == "nvidia.com/gpu"
    with pytest.raises(ConfigError, match="'Big_GPU' is not a valid resource name"):
        qualify_resource_name("Big_GPU")


def test_parse_config_accepts_decoded_documents_directly() -> None:
    config = parse_config({"flags": {"migStrategy": "mixed"}}, "<api>")
    assert config.flags.mig_strategy == "mixed"
    with pytest.raises(ConfigError, match=r"^<api>: flags\.migStrategy"):
        parse_config({"flags": {"migStrategy": 1}}, "<api>")

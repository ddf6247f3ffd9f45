"""NVIDIA v0.20 settings that must load here unchanged: keys, flags, env vars, spellings, stray keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.cli.main import main
from nvidia_device_plugin.config.flags import resolve_config
from nvidia_device_plugin.config.loader import gfd_incompatibilities, parse_config_text
from nvidia_device_plugin.config.v1 import DEFAULT_CDI_SPEC_DIR

from support.configs import parse_args


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


# --------------------------------------------------------------------------------------------------------
# sharedDevicesAllocationPolicy


def test_allocation_policy_defaults_to_distributed_and_comes_from_key_flag_or_env(tmp_path: Path) -> None:
    assert resolve_config(parse_args(), {}).flags.plugin.shared_devices_allocation_policy == "distributed"
    path = config_file(tmp_path, "flags: {plugin: {sharedDevicesAllocationPolicy: packed}}")
    from_file = resolve_config(parse_args("--config-file", str(path)), {})
    assert from_file.flags.plugin.shared_devices_allocation_policy == "packed"
    env = {"SHARED_DEVICES_ALLOCATION_POLICY": "packed"}
    assert resolve_config(parse_args(), env).flags.plugin.shared_devices_allocation_policy == "packed"
    flag = parse_args("--config-file", str(path), "--shared-devices-allocation-policy", "distributed")
    assert resolve_config(flag, env).flags.plugin.shared_devices_allocation_policy == "distributed"


def test_bad_allocation_policy_names_its_origin() -> None:
    with pytest.raises(ConfigError, match=r"^env SHARED_DEVICES_ALLOCATION_POLICY: .* got 'spread'"):
        resolve_config(parse_args(), {"SHARED_DEVICES_ALLOCATION_POLICY": "spread"})
    with pytest.raises(ConfigError, match="must be one of distributed, packed, got 'Packed'"):
        parse_config_text("flags: {plugin: {sharedDevicesAllocationPolicy: Packed}}")


# --------------------------------------------------------------------------------------------------------
# CDI settings, carried for the CDI spec generator


def test_cdi_flags_and_env_vars_are_carried() -> None:
    args = parse_args("--cdi-feature-flags", "a,b", "--cdi-feature-flags", "c", "--cdi-spec-dir", "/etc/cdi")
    env = {
        "CDI_DISABLE_HOOKS": "enable-cuda-compat, update-ldcache",
        "NVIDIA_CDI_HOOK_PATH": "/opt/hook",
        "CDI_ANNOTATION_PREFIX": "cdi.example.com/",
        "DRIVER_ROOT_CTR_PATH": "/host-driver",
    }
    plugin = resolve_config(args, env).flags.plugin
    assert plugin.cdi_feature_flags == ("a", "b", "c")
    assert plugin.cdi_disable_hooks == ("enable-cuda-compat", "update-ldcache")
    assert plugin.cdi_spec_dir == "/etc/cdi"
    assert plugin.nvidia_ctk_path == "/opt/hook"
    assert plugin.cdi_annotation_prefix == "cdi.example.com/"
    assert plugin.container_driver_root == "/host-driver"


def test_cdi_keys_in_the_file_and_defaults() -> None:
    plugin = parse_config_text(
        "flags: {plugin: {cdiFeatureFlags: [x, y], cdiDisableHooks: 'h1,h2', cdiSpecDir: /run/cdi}}"
    ).flags.plugin
    assert (plugin.cdi_feature_flags, plugin.cdi_disable_hooks) == (("x", "y"), ("h1", "h2"))
    assert plugin.cdi_spec_dir == "/run/cdi"
    defaults = parse_config_text("").flags.plugin
    assert (defaults.cdi_spec_dir, defaults.cdi_feature_flags) == (DEFAULT_CDI_SPEC_DIR, ())


def test_bad_cdi_values_are_named() -> None:
    with pytest.raises(
        ConfigError, match=r"^flag --cdi-spec-dir: flags\.plugin\.cdiSpecDir: must be an absolute"
    ):
        resolve_config(parse_args("--cdi-spec-dir", "cdi"), {})
    with pytest.raises(ConfigError, match=r"flags.plugin.cdiDisableHooks\[0\] must be a string, got 1"):
        parse_config_text("flags: {plugin: {cdiDisableHooks: [1]}}")


# --------------------------------------------------------------------------------------------------------
# GFD's flags and the discovery strategy


@pytest.mark.parametrize(
    "gfd",
    [
        "{sleepInterval: infinite}",
        "{sleepInterval: 60s}",
        "{sleepInterval: 1m30s}",
        "{sleepInterval: 60000000000}",
        "{oneshot: true, noTimestamp: true, outputFile: /etc/kubernetes/features.d/gfd}",
        "{machineTypeFile: /sys/class/dmi/id/product_name, noCleanupOnExit: false}",
    ],
)
def test_every_gfd_value_nvidia_accepts_loads(gfd: str) -> None:
    parse_config_text(f"flags: {{useNodeFeatureAPI: true, deviceDiscoveryStrategy: nvml, gfd: {gfd}}}")


@pytest.mark.parametrize("strategy", ["auto", "nvml", "tegra"])
def test_device_discovery_strategy_is_kept(strategy: str) -> None:
    config = resolve_config(parse_args("--device-discovery-strategy", strategy), {})
    assert config.flags.device_discovery_strategy == strategy


# --------------------------------------------------------------------------------------------------------
# Spelling and stray keys


def test_key_differing_only_in_case_is_accepted_with_a_warning_naming_the_canonical_spelling() -> None:
    config = parse_config_text(
        "sharing:\n  timeslicing:\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n", "cm.yaml"
    )
    assert config.sharing.time_slicing.resources[0].replicas == 2
    assert [w.message for w in config.warnings] == [
        "cm.yaml: sharing.timeslicing: read as timeSlicing (write it timeSlicing)"
    ]
    assert config.unknown_keys == ()


def test_an_override_of_a_case_variant_key_wins_over_it(tmp_path: Path) -> None:
    path = config_file(tmp_path, "flags: {migstrategy: mixed}")
    config = resolve_config(parse_args("--config-file", str(path)), {"MIG_STRATEGY": "single"})
    assert config.flags.mig_strategy == "single"
    assert [w.kind for w in config.warnings] == ["key-case"]


def test_daemon_loading_ignores_unknown_keys_with_a_warning_each(tmp_path: Path) -> None:
    path = config_file(
        tmp_path,
        "flags: {migStrategy: single, plugin: {passDeviceSpec: true}}\nsharingg: {}\n",
    )
    config = resolve_config(parse_args("--config-file", str(path)), {})
    assert config.flags.mig_strategy == "single"  # the rest of the file is applied
    assert sorted(config.unknown_keys) == ["flags.plugin.passDeviceSpec", "sharingg"]
    assert sorted(w.message for w in config.warnings) == [
        f"{path}: flags.plugin.passDeviceSpec: unknown field (did you mean passDeviceSpecs?); ignored",
        f"{path}: sharingg: unknown field (did you mean sharing?); ignored",
    ]
    with pytest.raises(ConfigError, match="did you mean sharing"):
        resolve_config(parse_args("--config-file", str(path)), {}, strict=True)


def test_unknown_keys_inside_lists_are_warned_about_too(tmp_path: Path) -> None:
    path = config_file(tmp_path, "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, renam: x}]}}")
    config = resolve_config(parse_args("--config-file", str(path)), {})
    assert config.unknown_keys == ("sharing.timeSlicing.resources[0].renam",)


def test_warnings_do_not_make_two_configs_differ() -> None:
    assert parse_config_text("flags: {migstrategy: none}") == parse_config_text("")


# --------------------------------------------------------------------------------------------------------
# check-config: strict, with warnings


def test_check_config_refuses_unknown_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = config_file(tmp_path, "flags: {plugin: {passDeviceSpec: true}}")
    assert main(["check-config", str(path)]) == 1
    assert (
        "flags.plugin.passDeviceSpec: unknown field (did you mean passDeviceSpecs?)"
        in capsys.readouterr().err
    )


def test_check_config_warns_on_case_and_on_one_replica_for_gfd(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config_file(tmp_path, "sharing: {timeslicing: {resources: [{name: nvidia.com/gpu, replicas: 1}]}}")
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr()
    assert out.out == f"{path}: valid\n"
    assert out.err.splitlines() == [
        f"warning: {path}: sharing.timeslicing: read as timeSlicing (write it timeSlicing)",
        f"warning: {path}: sharing.timeSlicing.resources[0].replicas is 1: accepted here, but GPU Feature "
        "Discovery refuses this file (number of replicas must be >= 2), so a ConfigMap shared with GFD "
        "cannot use it",
    ]


def test_gfd_incompatibilities_name_only_single_replica_entries() -> None:
    config = parse_config_text(
        "sharing: {mps: {resources: [{name: gpu, replicas: 2}, {name: mig-1g.10gb, replicas: 1}]}}"
    )
    assert [p.split(":")[0] for p in gfd_incompatibilities(config)] == [
        "sharing.mps.resources[1].replicas is 1"
    ]


# --------------------------------------------------------------------------------------------------------
# IMEX


def test_imex_flags_and_keys() -> None:
    config = resolve_config(parse_args("--imex-required"), {"IMEX_CHANNEL_IDS": "0"})
    assert (config.imex.channel_ids, config.imex.required) == ((0,), True)
    with pytest.raises(ConfigError, match=r"imex.channelIDs: must be \[\] or \[0\]"):
        parse_config_text("imex: {channelIDs: [1]}")

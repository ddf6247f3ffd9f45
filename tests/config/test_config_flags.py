"""config.flags and config.source: flag > env var > config file > default, and where the file comes from."""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path

import pytest

from nvidia_device_plugin.config.flags import (
    add_config_arguments,
    apply_health_env,
    config_source,
    overrides_from,
    parse_bool,
    resolve_config,
)
from nvidia_device_plugin.config.loader import Override, parse_config_text
from nvidia_device_plugin.config.options import CONFIG_OPTIONS
from nvidia_device_plugin.config.source import ConfigSource
from nvidia_device_plugin.config.v1 import DEFAULT_IGNORED_XIDS, Health
from nvidia_device_plugin.errors import ConfigError

FILE = """
version: v1
flags:
  migStrategy: single
  failOnInitError: false
  nvidiaDriverRoot: /file/driver
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: volume-mounts
    deviceIDStrategy: index
"""


def parse_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nvidia-device-plugin", exit_on_error=False)
    add_config_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(FILE)
    return path


# --------------------------------------------------------------------------------------------------------
# Precedence


def test_defaults_without_file_flags_or_env() -> None:
    config = resolve_config(parse_args(), {})
    assert config.flags.mig_strategy == "none"
    assert config.flags.fail_on_init_error is True
    assert config.flags.plugin.device_list_strategy == ("envvar",)


def test_file_beats_defaults(config_file: Path) -> None:
    config = resolve_config(parse_args("--config-file", str(config_file)), {})
    assert config.flags.mig_strategy == "single"
    assert config.flags.fail_on_init_error is False
    assert config.flags.plugin.device_id_strategy == "index"
    assert config.flags.nvidia_dev_root == "/file/driver"  # follows the driver root


def test_env_beats_file(config_file: Path) -> None:
    env = {
        "CONFIG_FILE": str(config_file),
        "MIG_STRATEGY": "mixed",
        "FAIL_ON_INIT_ERROR": "TRUE",
        "DEVICE_LIST_STRATEGY": "envvar, cdi-annotations",
        "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver",
    }
    config = resolve_config(parse_args(), env)
    assert config.flags.mig_strategy == "mixed"
    assert config.flags.fail_on_init_error is True
    assert config.flags.plugin.device_list_strategy == ("envvar", "cdi-annotations")
    assert config.flags.nvidia_driver_root == config.flags.nvidia_dev_root == "/run/nvidia/driver"
    assert config.flags.plugin.device_id_strategy == "index"  # not overridden: still the file's


def test_cli_beats_env_and_file(config_file: Path) -> None:
    env = {"MIG_STRATEGY": "mixed", "PASS_DEVICE_SPECS": "true", "DEVICE_ID_STRATEGY": "uuid"}
    args = parse_args(
        "--config-file",
        str(config_file),
        "--mig-strategy",
        "none",
        "--pass-device-specs=false",
        "--device-list-strategy",
        "cdi-cri",
        "--device-list-strategy=envvar",
    )
    config = resolve_config(args, env)
    assert config.flags.mig_strategy == "none"
    assert config.flags.plugin.pass_device_specs is False
    assert config.flags.plugin.device_list_strategy == ("cdi-cri", "envvar")
    assert config.flags.plugin.device_id_strategy == "uuid"  # env still beats the file


def test_bare_boolean_flag_means_true() -> None:
    assert resolve_config(parse_args("--pass-device-specs"), {}).flags.plugin.pass_device_specs is True
    assert resolve_config(parse_args("--gdrcopy-enabled", "yes"), {}).flags.gdrcopy_enabled is True


def test_flag_aliases_and_env_order_follow_nvidia() -> None:
    assert resolve_config(parse_args("--driver-root", "/d"), {}).flags.nvidia_driver_root == "/d"
    assert resolve_config(parse_args("--nvidia-ctk-path", "/ctk"), {}).flags.plugin.nvidia_ctk_path == "/ctk"
    both = {"NVIDIA_CDI_HOOK_PATH": "/hook", "NVIDIA_CTK_PATH": "/ctk"}
    assert resolve_config(parse_args(), both).flags.plugin.nvidia_ctk_path == "/hook"  # first listed wins
    root = {"DRIVER_ROOT_CTR_PATH": "/a", "CONTAINER_DRIVER_ROOT": "/b"}
    assert resolve_config(parse_args(), root).flags.plugin.container_driver_root == "/a"
    assert (
        resolve_config(parse_args(), {"CONTAINER_DRIVER_ROOT": "/b"}).flags.plugin.container_driver_root
        == "/b"
    )


def test_empty_env_values_count_as_unset(config_file: Path) -> None:
    config = resolve_config(
        parse_args(), {"CONFIG_FILE": str(config_file), "MIG_STRATEGY": "", "GDS_ENABLED": " "}
    )
    assert config.flags.mig_strategy == "single"
    assert config.flags.gds_enabled is False


def test_imex_flags() -> None:
    config = resolve_config(parse_args("--imex-required"), {"IMEX_CHANNEL_IDS": "0"})
    assert config.imex.channel_ids == (0,)
    assert config.imex.required is True


def test_overrides_from_reports_paths_and_origins() -> None:
    overrides = overrides_from(
        parse_args("--mig-strategy", "mixed"), {"MIG_STRATEGY": "none", "MPS_ROOT": "/mps"}
    )
    assert overrides == {
        "flags.migStrategy": Override("mixed", "flag --mig-strategy"),
        "flags.mpsRoot": Override("/mps", "env MPS_ROOT"),
    }


def test_every_option_has_a_flag_an_env_var_and_a_config_path_the_loader_knows() -> None:
    args = parse_args()
    for option in CONFIG_OPTIONS:
        assert option.flags and option.env
        assert hasattr(args, option.dest) and getattr(args, option.dest) is None
        sample = {"bool": "true", "list": "envvar", "ints": "0", "str": "none"}[option.kind]
        if option.path.endswith(("Root", "Path", "Dir")):
            sample = "/none"  # host paths must be absolute
        env_value = {
            "flags.deviceDiscoveryStrategy": "auto",
            "flags.plugin.deviceIDStrategy": "uuid",
            "flags.plugin.sharedDevicesAllocationPolicy": "packed",
            "flags.plugin.cdiSpecDir": "/run/cdi",
        }.get(option.path, sample)
        # strict: the path exists, as an unknown field would raise
        resolve_config(args, {option.env[0]: env_value}, strict=True)


# --------------------------------------------------------------------------------------------------------
# Bad flag and env values name their origin

BAD_VALUES = [
    (
        {"MIG_STRATEGY": "mix"},
        (),
        "env MIG_STRATEGY: flags.migStrategy must be one of none, single, mixed, got 'mix'",
    ),
    (
        {},
        ("--mig-strategy", "mix"),
        "flag --mig-strategy: flags.migStrategy must be one of none, single, mixed",
    ),
    ({"FAIL_ON_INIT_ERROR": "maybe"}, (), "env FAIL_ON_INIT_ERROR: flags.failOnInitError must be a boolean"),
    (
        {},
        ("--pass-device-specs=sure",),
        "flag --pass-device-specs: flags.plugin.passDeviceSpecs must be a boolean",
    ),
    (
        {"DEVICE_LIST_STRATEGY": "envvar,mounts"},
        (),
        "env DEVICE_LIST_STRATEGY: flags.plugin.deviceListStrategy[1]",
    ),
    (
        {"DEVICE_LIST_STRATEGY": ","},
        (),
        "env DEVICE_LIST_STRATEGY: flags.plugin.deviceListStrategy: name at least",
    ),
    (
        {"DEVICE_ID_STRATEGY": "serial"},
        (),
        "env DEVICE_ID_STRATEGY: flags.plugin.deviceIDStrategy must be one of",
    ),
    (
        {"IMEX_CHANNEL_IDS": "zero"},
        (),
        "env IMEX_CHANNEL_IDS: imex.channelIDs[0] must be an integer channel ID, got 'zero'",
    ),
    ({"IMEX_CHANNEL_IDS": "3"}, (), "env IMEX_CHANNEL_IDS: imex.channelIDs: must be [] or [0]"),
    (
        {"DEVICE_DISCOVERY_STRATEGY": "pci"},
        (),
        "env DEVICE_DISCOVERY_STRATEGY: flags.deviceDiscoveryStrategy",
    ),
]


@pytest.mark.parametrize(("env", "argv", "message"), BAD_VALUES, ids=[m[:50] for _, _, m in BAD_VALUES])
def test_bad_flag_or_env_value_names_its_origin(
    env: dict[str, str], argv: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_config(parse_args(*argv), env)
    assert str(err.value).startswith(message)


def test_file_errors_still_name_the_file(config_file: Path) -> None:
    config_file.write_text("flags:\n  migStrategy: mix\n")
    with pytest.raises(ConfigError, match=rf"^{config_file}: flags\.migStrategy must be one of"):
        resolve_config(parse_args(), {"CONFIG_FILE": str(config_file), "DEVICE_ID_STRATEGY": "index"})


@pytest.mark.parametrize(
    ("text", "value"),
    [(word, True) for word in ("true", "TRUE", "1", "yes", "Yes", "t")]
    + [(word, False) for word in ("false", "False", "0", "no", "NO", " f ")],
)
def test_parse_bool_words(text: str, value: bool) -> None:
    assert parse_bool(text) is value


@pytest.mark.parametrize("text", ["", "maybe", "2", "on", "enabled", "truee"])
def test_parse_bool_rejects_other_words(text: str) -> None:
    assert parse_bool(text) is None


# --------------------------------------------------------------------------------------------------------
# DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS


def health_with(env: dict[str, str], base: Health | None = None) -> Health:
    return apply_health_env(base or Health(), env)


@pytest.mark.parametrize("value", ["all", "ALL", "xids", "48,all", " xids "])
def test_disable_all_or_xids_turns_health_checks_off(value: str) -> None:
    health = health_with({"DP_DISABLE_HEALTHCHECKS": value})
    assert health.disabled is True
    assert not health.is_critical(48)


def test_disable_list_adds_to_the_ignored_set() -> None:
    health = health_with({"DP_DISABLE_HEALTHCHECKS": "48, 79"})
    assert health.disabled is False
    assert health.ignored_xids == DEFAULT_IGNORED_XIDS | {48, 79}
    assert not health.is_critical(48) and not health.is_critical(13) and health.is_critical(94)


def test_disable_list_extends_the_configs_own_list() -> None:
    health = health_with({"DP_DISABLE_HEALTHCHECKS": "48,79"}, Health(ignored_xids=frozenset({13})))
    assert health.ignored_xids == frozenset({13, 48, 79})


def test_malformed_entries_are_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        health = health_with({"DP_DISABLE_HEALTHCHECKS": "48,,invalid,79"})
    assert health.ignored_xids == DEFAULT_IGNORED_XIDS | {48, 79}
    assert "invalid" in caplog.text


def test_enable_list_overrides_the_default_ignored_xids() -> None:
    health = health_with({"DP_ENABLE_HEALTHCHECKS": "13,31"})
    assert health.ignored_xids == DEFAULT_IGNORED_XIDS - {13, 31}
    assert health.is_critical(13) and health.is_critical(31) and not health.is_critical(43)


def test_enable_wins_over_disable_for_the_same_xid() -> None:
    health = health_with({"DP_DISABLE_HEALTHCHECKS": "48,79", "DP_ENABLE_HEALTHCHECKS": "48"})
    assert health.is_critical(48) and not health.is_critical(79)


def test_disable_all_but_the_enabled_ones() -> None:
    health = health_with({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "48,13"})
    assert health.disabled is False
    assert health.is_critical(48) and health.is_critical(13)
    assert not health.is_critical(79) and not health.is_critical(31)


def test_enable_all_makes_every_xid_critical() -> None:
    health = health_with({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "all"})
    assert health.disabled is False
    assert all(health.is_critical(xid) for xid in [*DEFAULT_IGNORED_XIDS, 48, 79])


def test_no_health_env_leaves_health_alone() -> None:
    base = Health(ignored_xids=frozenset({1}), critical_xids=frozenset({48}))
    assert health_with({}, base) is base
    assert health_with({"DP_DISABLE_HEALTHCHECKS": ""}, base) is base


def test_resolve_config_applies_health_env_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("health:\n  ignoredXIDs: [13]\n")
    config = resolve_config(parse_args("--config-file", str(path)), {"DP_DISABLE_HEALTHCHECKS": "48"})
    assert config.health.ignored_xids == frozenset({13, 48})


# --------------------------------------------------------------------------------------------------------
# Where the file comes from


def configmap_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    """A ConfigMap volume as kubelet lays it out: keys are symlinks into ..data."""
    mount = tmp_path / "configs"
    data = mount / "..2026_12_02_10_00_00.000000001"
    data.mkdir(parents=True)
    for name, text in files.items():
        (data / name).write_text(text)
        (mount / name).symlink_to(Path("..data") / name)
    (mount / "..data").symlink_to(data.name)
    return mount


def test_config_source_modes(tmp_path: Path) -> None:
    assert config_source(parse_args(), {}) == ConfigSource()
    assert config_source(parse_args("--config-file", "/a.yaml"), {}) == ConfigSource(file=Path("/a.yaml"))
    assert config_source(parse_args(), {"CONFIG_FILE": "/b.yaml"}) == ConfigSource(file=Path("/b.yaml"))
    from_env = config_source(parse_args(), {"NVDP_CONFIG_DIR": "/d", "NVDP_CONFIG_NAME": "a100"})
    assert from_env == ConfigSource(directory=Path("/d"), name="a100")
    mixed = config_source(
        parse_args("--config-dir", "/d", "--config-default", "default"), {"NVDP_CONFIG_NAME": "x"}
    )
    assert mixed == ConfigSource(directory=Path("/d"), name="x", default_name="default")


def test_cli_directory_beats_an_env_config_file() -> None:
    source = config_source(
        parse_args("--config-dir", "/d", "--config-name", "n"), {"CONFIG_FILE": "/image.yaml"}
    )
    assert source == ConfigSource(directory=Path("/d"), name="n")


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (("--config-file", "/a", "--config-dir", "/d"), {}, "are both given on the command line"),
        (
            (),
            {"CONFIG_FILE": "/a", "NVDP_CONFIG_DIR": "/d", "NVDP_CONFIG_NAME": "n"},
            "both given in the environment",
        ),
        (("--config-name", "n"), {}, "give --config-dir"),
        (
            ("--config-dir", "/d", "--config-fallback-strategies", "named,bogus"),
            {},
            "unknown strategy 'bogus'",
        ),
        (("--config-dir", "/d", "--config-name", "../etc/passwd"), {}, "must be a plain file name"),
        (("--config-dir", "/d", "--config-name", "..data"), {}, "must be a plain file name"),
    ],
)
def test_contradictory_sources_are_config_errors(
    argv: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        config_source(parse_args(*argv), env)


def test_directory_source_prefers_the_named_config_then_the_default(tmp_path: Path) -> None:
    mount = configmap_dir(
        tmp_path, {"default": "flags: {migStrategy: none}\n", "a100": "flags: {migStrategy: mixed}\n"}
    )
    named = ConfigSource.from_directory(mount, name="a100", default_name="default")
    assert named.resolve() == mount / "a100"
    assert named.load().flags.mig_strategy == "mixed"
    fallback = ConfigSource.from_directory(mount, name="t4", default_name="default")
    assert fallback.resolve() == mount / "default"
    assert fallback.load().flags.mig_strategy == "none"
    assert named.watch_paths() == [mount]


def test_directory_source_without_either_file_names_both_paths(tmp_path: Path) -> None:
    mount = configmap_dir(tmp_path, {"other": ""})
    source = ConfigSource.from_directory(mount, name="t4", default_name="default")
    with pytest.raises(ConfigError) as err:
        source.load()
    assert str(mount / "t4") in str(err.value) and str(mount / "default") in str(err.value)
    with pytest.raises(ConfigError, match=r"t4: config file not found"):
        ConfigSource.from_directory(mount, name="t4").load()


def test_source_load_applies_overrides_and_names_the_file(tmp_path: Path) -> None:
    mount = configmap_dir(tmp_path, {"default": "flags: {migStrategy: nonsense}\n"})
    source = ConfigSource.from_directory(mount, default_name="default")
    with pytest.raises(ConfigError, match=rf"^{mount / 'default'}: flags\.migStrategy"):
        source.load()
    fixed = source.load({"flags.migStrategy": Override("single", "env MIG_STRATEGY")})
    assert fixed.flags.mig_strategy == "single"


def test_file_and_no_file_sources(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "config.yaml"
    assert ConfigSource.from_file(path).watch_paths() == [tmp_path / "sub"]
    with pytest.raises(ConfigError, match="config file not found"):
        ConfigSource.from_file(path).load()
    assert ConfigSource().resolve() is None
    assert ConfigSource().watch_paths() == []
    assert ConfigSource().load(
        {"flags.migStrategy": Override("mixed", "flag --mig-strategy")}
    ).flags.mig_strategy == ("mixed")


@pytest.mark.parametrize(
    ("keys", "strategies", "chosen"),
    [
        (["default", "a100"], "named,single", "default"),  # NVIDIA's default strategies
        (["a100"], "named,single", "a100"),  # single: the only key
        (["a100", "h100"], "named,single,empty", None),  # empty: the built-in defaults
        (["a100"], "named", "error"),
    ],
)
def test_a_directory_without_name_or_default_follows_the_fallback_strategies(
    tmp_path: Path, keys: list[str], strategies: str, chosen: str | None
) -> None:
    mount = configmap_dir(
        tmp_path, {key: f"flags: {{migStrategy: {'mixed' if key == 'a100' else 'none'}}}\n" for key in keys}
    )
    source = config_source(
        parse_args("--config-dir", str(mount), "--config-fallback-strategies", strategies), {}
    )
    if chosen == "error":
        with pytest.raises(
            ConfigError, match=r"fallback strategies \(named\) chose none of its configs \(a100\)"
        ):
            source.resolve()
        return
    assert source.resolve() == (None if chosen is None else mount / chosen)
    config = source.load()
    assert config.flags.mig_strategy == ("mixed" if chosen == "a100" else "none")


def test_fallback_strategies_come_from_the_environment_too(tmp_path: Path) -> None:
    mount = configmap_dir(tmp_path, {"a100": "version: v1\n", "h100": "version: v1\n"})
    source = config_source(
        parse_args("--config-dir", str(mount)), {"NVDP_CONFIG_FALLBACK_STRATEGIES": "empty"}
    )
    assert source.resolve() is None


@pytest.mark.parametrize(
    "key",
    ["flags.mpsRoot", "flags.nvidiaDriverRoot", "flags.nvidiaDevRoot", "flags.plugin.containerDriverRoot"],
)
def test_host_paths_must_be_absolute(key: str) -> None:
    *parents, leaf = key.split(".")
    nesting = "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parents))
    text = f"version: v1\n{nesting}{'  ' * len(parents)}{leaf}: run/mps\n"
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: must be an absolute path, got 'run/mps'"):
        parse_config_text(text)

"""config.flags: flag > env var > config file > default."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.flags import overrides_from, parse_bool, resolve_config
from nvidia_device_plugin.config.loader import Override
from nvidia_device_plugin.config.options import CONFIG_OPTIONS

from support.configs import parse_args

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
            "dra.gpus": "0,1",
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

"""config.flags and config.source: where the config file comes from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.flags import config_source
from nvidia_device_plugin.config.loader import Override, parse_config_text
from nvidia_device_plugin.config.source import ConfigSource
from nvidia_device_plugin.config.v1 import ConfigOrigin

from support.configs import configmap_volume, parse_args

# --------------------------------------------------------------------------------------------------------
# Where the file comes from


def configmap_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    """The ConfigMap volume these tests mount at tmp_path/configs."""
    return configmap_volume(tmp_path / "configs", files)


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


def test_a_config_linked_by_the_config_manager_names_the_file_the_node_label_chose(tmp_path: Path) -> None:
    chosen = tmp_path / "configs" / "shared"
    chosen.parent.mkdir()
    chosen.write_text("version: v1\n")
    link = tmp_path / "link" / "config.yaml"
    link.parent.mkdir()
    link.symlink_to(chosen)
    source = ConfigSource.linked_by_label(link, "nvidia.com/device-plugin.config")
    why = f"node label nvidia.com/device-plugin.config: {chosen} (config-manager's log line says why)"
    assert source.load().origin == ConfigOrigin(str(chosen), "node-label", why)
    assert source.watch_paths() == [link.parent, chosen.parent]
    link.unlink()
    link.write_text("")  # the config-manager's empty config (fallback empty): no link, built-in defaults
    label = "node label nvidia.com/device-plugin.config"
    why = f"{label}: the built-in defaults (config-manager's log line says why)"
    assert source.load().origin == ConfigOrigin("", "node-label", why)


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


# ---- how the config was chosen: Config.origin, for the start-up line and the active-config metric -------


def test_the_origin_says_which_file_was_read_and_why(tmp_path: Path) -> None:
    mount = configmap_dir(tmp_path, {"default": "version: v1\n", "a100": "version: v1\n"})
    cases = [
        (
            config_source(parse_args("--config-dir", str(mount), "--config-name", "a100"), {}),
            "a100",
            "config-name",
            f"--config-name 'a100' in {mount}",
        ),
        (
            config_source(
                parse_args("--config-dir", str(mount), "--config-default", "default"),
                {"NVDP_CONFIG_NAME": "t4"},
            ),
            "default",
            "config-default",
            f"--config-default 'default' in {mount} (the --config-name 't4' does not exist there)",
        ),
        (
            config_source(parse_args("--config-dir", str(mount)), {}),
            "default",
            "fallback-named",
            "no --config-name or --config-default: fallback strategy named chose 'default' among a100, "
            f"default in {mount}",
        ),
        (
            config_source(parse_args("--config-file", str(mount / "a100")), {}),
            "a100",
            "config-file",
            f"--config-file {mount / 'a100'}, a link to {mount / '..data/a100'}",
        ),
        (
            config_source(parse_args(), {"CONFIG_FILE": str(mount / "a100")}),
            "a100",
            "config-file",
            f"CONFIG_FILE {mount / 'a100'}, a link to {mount / '..data/a100'}",
        ),
    ]
    for source, name, choice, why in cases:
        origin = source.load().origin
        assert origin == ConfigOrigin(str(mount / name), choice, why)


def test_fallback_single_empty_and_no_file_origins(tmp_path: Path) -> None:
    one = configmap_dir(tmp_path / "one", {"a100": "version: v1\n"})
    single = config_source(parse_args("--config-dir", str(one)), {}).load().origin
    assert single is not None and (single.file, single.choice) == (str(one / "a100"), "fallback-single")
    empty = config_source(parse_args("--config-dir", str(one), "--config-fallback-strategies", "empty"), {})
    assert empty.load().origin == ConfigOrigin(
        "",
        "fallback-empty",
        "no --config-name or --config-default: fallback strategy empty chose the built-in defaults "
        f"among a100 in {one}",
    )
    assert ConfigSource().load().origin == ConfigOrigin(
        "", "defaults", "no config file given: built-in defaults"
    )

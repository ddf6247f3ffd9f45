"""Where each setting comes from: CLI flag > environment variable > config file > default.

The flag and environment-variable names are NVIDIA's (cmd/nvidia-device-plugin/main.go; config.options
lists them), so a DaemonSet written for NVIDIA's plugin configures this one the same way. Conventions, as
in NVIDIA's urfave/cli flags:

- Booleans: `--pass-device-specs` alone means true; `--pass-device-specs=false` (or `true`, `1`, `0`, `yes`,
  `no`, `t`, `f`, case-insensitive) sets it explicitly. Environment values use the same words.
- Lists (`--device-list-strategy`, `--imex-channel-ids`): comma-separated, and the flag may be repeated.
- Where NVIDIA lists several environment variables for one flag, the first one set wins.
- An environment variable set to the empty string counts as unset (NVIDIA would apply the empty value).

The config file is chosen by `--config-file` (env CONFIG_FILE, NVIDIA's), or by a directory holding several
configs as a ConfigMap mounted whole: `--config-dir` (env NVDP_CONFIG_DIR), `--config-name` (env
NVDP_CONFIG_NAME, e.g. the node's `nvidia.com/device-plugin.config` label) and `--config-default` (env
NVDP_CONFIG_DEFAULT) for nodes whose named config does not exist. These three are this plugin's own: NVIDIA
does the same job with a config-manager sidecar that copies the chosen file.

Health checks keep NVIDIA's environment switches (internal/rm/health.go), applied over the config's `health`
section (see `apply_health_env`).
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.loader import Override
from nvidia_device_plugin.config.options import CONFIG_OPTIONS, SOURCE_HELP, SOURCE_OPTIONS, ConfigOption
from nvidia_device_plugin.config.selection import DEFAULT_FALLBACK_STRATEGIES, parse_fallback_strategies
from nvidia_device_plugin.config.source import ConfigSource
from nvidia_device_plugin.config.v1 import Config, Health

__all__ = [
    "DISABLE_HEALTHCHECKS_ENV",
    "ENABLE_HEALTHCHECKS_ENV",
    "add_config_arguments",
    "add_config_option_arguments",
    "apply_health_env",
    "config_source",
    "load_from",
    "option_default",
    "overrides_from",
    "parse_bool",
    "resolve_config",
    "states_default",
]

log = logging.getLogger(__name__)

DISABLE_HEALTHCHECKS_ENV = "DP_DISABLE_HEALTHCHECKS"
ENABLE_HEALTHCHECKS_ENV = "DP_ENABLE_HEALTHCHECKS"

_TRUE = frozenset({"true", "t", "1", "yes"})
_FALSE = frozenset({"false", "f", "0", "no"})
_XID = re.compile(r"[0-9]+")
_INTEGER = re.compile(r"-?[0-9]+")


def parse_bool(text: str) -> bool | None:
    """NVIDIA-style boolean words (true/false, 1/0, yes/no, t/f, any case); None for anything else."""
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    return None


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the config-source flags and every `CONFIG_OPTIONS` flag; all default to None ("not given")."""
    group = parser.add_argument_group(
        "configuration (precedence: flag > environment variable > file > default)"
    )
    for dest, flag, env in SOURCE_OPTIONS:
        metavar = {"config_name": "NAME", "config_default": "NAME", "config_fallback_strategies": "LIST"}.get(
            dest, "PATH"
        )
        group.add_argument(
            flag, dest=dest, default=None, metavar=metavar, help=f"{SOURCE_HELP[dest]} [env {env}]"
        )
    _add_options(group, with_env=True)


def add_config_option_arguments(parser: argparse.ArgumentParser) -> None:
    """Only the `CONFIG_OPTIONS` flags (check-config: the file comes from its arguments), without env."""
    _add_options(
        parser.add_argument_group("settings over every config checked (as on run's command line)"), False
    )


def _add_options(group: argparse._ArgumentGroup, with_env: bool) -> None:
    for option in CONFIG_OPTIONS:
        help_text = option.help
        if not states_default(help_text):
            help_text += f" (default: {option_default(option)})"
        if with_env:
            help_text += f" [env {' or '.join(option.env)}]"
        if option.kind == "bool":
            group.add_argument(
                *option.flags,
                dest=option.dest,
                nargs="?",
                const="true",
                default=None,
                metavar="BOOL",
                help=help_text,
            )
        elif option.kind in ("list", "ints"):
            group.add_argument(
                *option.flags, dest=option.dest, action="append", default=None, metavar="A,B", help=help_text
            )
        else:
            group.add_argument(*option.flags, dest=option.dest, default=None, metavar="VALUE", help=help_text)


_STATES_DEFAULT = re.compile(r"\(default[ :]|\bthe default\b")


def states_default(help_text: str) -> bool:
    """Whether a flag's help text says its default already ("(default: x)", "(spread, the default)")."""
    return _STATES_DEFAULT.search(help_text) is not None


_ACRONYMS = (("IDs", "Ids"), ("ID", "Id"), ("CTK", "Ctk"), ("CDI", "Cdi"))
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def _attribute(key: str) -> str:
    """A v1 key as its dataclass attribute: deviceIDStrategy -> device_id_strategy."""
    for acronym, word in _ACRONYMS:
        key = key.replace(acronym, word)
    return _CAMEL.sub("_", key).lower()


def option_default(option: ConfigOption) -> str:
    """The built-in default of `option`'s config field, as a flag would write it (true, a,b, none)."""
    value: object = Config()
    for part in option.path.split("."):
        value = getattr(value, _attribute(part))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | frozenset):
        return ",".join(str(v) for v in value) or "none"
    return str(value) or "''"


def overrides_from(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Override]:
    """Config path -> value for every option given on the command line or in the environment (CLI wins)."""
    overrides: dict[str, Override] = {}
    for option in CONFIG_OPTIONS:
        given = getattr(args, option.dest, None)
        if given is not None:
            origin = f"flag {option.flags[0]}"
            overrides[option.path] = Override(_convert(option, given), origin)
            continue
        for name in option.env:
            text = environ.get(name)
            if text is not None and text.strip():
                origin = f"env {name}"
                overrides[option.path] = Override(_convert(option, text), origin)
                break
    return overrides


def _convert(option: ConfigOption, given: object) -> object:
    """A flag or environment value (a string, or argparse's list) as the config document would hold it.

    This only translates text; it judges nothing. Text that is not a boolean or an integer stays text, so
    the config loader, the one validator, reports it against the flag or variable it came from.
    """
    texts = [str(item) for item in given] if isinstance(given, list) else [str(given)]
    if option.kind == "bool":
        value = parse_bool(texts[-1])
        return texts[-1] if value is None else value
    if option.kind == "str":
        return texts[-1].strip()
    parts = [part.strip() for text in texts for part in text.split(",") if part.strip()]
    if option.kind == "list":
        return parts
    return [int(part) if _INTEGER.fullmatch(part) else part for part in parts]


def config_source(args: argparse.Namespace, environ: Mapping[str, str]) -> ConfigSource:
    """The config file or directory named by the flags, else by the environment, else none (defaults).

    The command line decides the mode on its own when it names a file or a directory, so that an image's
    CONFIG_FILE does not collide with a `--config-dir` given at run time.
    """
    cli: dict[str, str | None] = {dest: getattr(args, dest, None) or None for dest, _, _ in SOURCE_OPTIONS}
    env: dict[str, str | None] = {dest: environ.get(name) or None for dest, _, name in SOURCE_OPTIONS}
    if cli["config_file"] or cli["config_dir"]:
        file, directory, where = cli["config_file"], cli["config_dir"], "on the command line"
    else:
        file, directory, where = env["config_file"], env["config_dir"], "in the environment"
    if file and directory:
        raise ConfigError(
            f"config file {file!r} and config directory {directory!r} are both given {where}; use either "
            "--config-file (CONFIG_FILE) or --config-dir (NVDP_CONFIG_DIR)"
        )
    if directory:
        name = cli["config_name"] or env["config_name"]
        default = cli["config_default"] or env["config_default"]
        fallbacks = cli["config_fallback_strategies"] or env["config_fallback_strategies"]
        strategies = parse_fallback_strategies(fallbacks) if fallbacks else DEFAULT_FALLBACK_STRATEGIES
        return ConfigSource.from_directory(
            Path(directory), name=name, default_name=default, fallback_strategies=strategies
        )
    if cli["config_name"] or cli["config_default"]:
        raise ConfigError(
            "--config-name and --config-default choose a file inside --config-dir; give --config-dir"
        )
    # NVDP_CONFIG_NAME/NVDP_CONFIG_DEFAULT alone mean nothing without a directory; ignore them.
    named_by = "--config-file" if cli["config_file"] else "CONFIG_FILE"
    return ConfigSource.from_file(Path(file), named_by) if file else ConfigSource()


def resolve_config(args: argparse.Namespace, environ: Mapping[str, str], *, strict: bool = False) -> Config:
    """The whole precedence chain: the chosen file, flag and environment overrides, health env vars.

    This is how the daemon loads its config, so unknown keys are warnings (`Config.warnings`), as NVIDIA
    ignores them; `strict=True` makes them errors, as check-config does.
    """
    return load_from(config_source(args, environ), args, environ, strict=strict)


def load_from(
    source: ConfigSource, args: argparse.Namespace, environ: Mapping[str, str], *, strict: bool = False
) -> Config:
    """resolve_config with the file chosen elsewhere (the node-label follower's link, for one)."""
    config = source.load(overrides_from(args, environ), strict=strict)
    return replace(config, health=apply_health_env(config.health, environ))


def apply_health_env(health: Health, environ: Mapping[str, str]) -> Health:
    """`health` with NVIDIA's DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS applied on top.

    Both are comma-separated lists of XIDs, or `all` (`xids` is a synonym: XID events are the only health
    check NVIDIA has). Following NVIDIA's internal/rm/health.go:
    - DP_DISABLE_HEALTHCHECKS=all turns health checks off;
    - DP_DISABLE_HEALTHCHECKS=48,79 adds those XIDs to the ignored set (the config's list, or the default);
    - DP_ENABLE_HEALTHCHECKS lists XIDs that count even when ignored (the default application XIDs too);
      with DP_DISABLE_HEALTHCHECKS=all only those XIDs are critical, and DP_ENABLE_HEALTHCHECKS=all makes
      every XID critical. (NVIDIA documents the "disable all but these" form, but its code then disables
      everything; we follow the documentation.)
    Entries that are not XIDs are ignored with a warning, as NVIDIA ignores them.
    """
    disable_all, disabled = _xid_selection(
        environ.get(DISABLE_HEALTHCHECKS_ENV, ""), DISABLE_HEALTHCHECKS_ENV
    )
    enable_all, enabled = _xid_selection(environ.get(ENABLE_HEALTHCHECKS_ENV, ""), ENABLE_HEALTHCHECKS_ENV)
    if enable_all:
        return replace(health, disabled=False, ignored_xids=frozenset(), critical_xids=None)
    if disable_all:
        if not enabled:
            return replace(health, disabled=True)
        return replace(
            health, disabled=False, ignored_xids=health.ignored_xids - enabled, critical_xids=enabled
        )
    if not disabled and not enabled:
        return health
    critical = health.critical_xids | enabled if health.critical_xids is not None else None
    return replace(
        health,
        disabled=health.disabled and not enabled,
        ignored_xids=(health.ignored_xids | disabled) - enabled,
        critical_xids=critical,
    )


def _xid_selection(value: str, name: str) -> tuple[bool, frozenset[int]]:
    """(all, xids) named by one of the health environment variables."""
    xids: set[int] = set()
    for token in (t.strip() for t in value.lower().split(",")):
        if token in ("all", "xids"):
            return True, frozenset()
        if not token:
            continue
        if _XID.fullmatch(token):
            xids.add(int(token))
        else:
            log.warning("%s: ignoring %r, which is not an XID", name, token)
    return False, frozenset(xids)

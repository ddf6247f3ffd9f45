"""`gpu-feature-discovery`'s own settings, each from flag > environment variable > config file > default, as
GFD v0.20 takes them (its urfave/cli flags over `flags.gfd.*` and `flags.useNodeFeatureAPI` of the config
file; spec.NewConfig applies a flag only when it is set on the command line or in the environment).

- oneshot: `--oneshot`, GFD_ONESHOT, flags.gfd.oneshot; false
- no timestamp: `--no-timestamp`, GFD_NO_TIMESTAMP, flags.gfd.noTimestamp; false
- sleep interval: `--sleep-interval`, GFD_SLEEP_INTERVAL, flags.gfd.sleepInterval; 60s
- output file: `--output-file` (`-o`, `--output`), GFD_OUTPUT_FILE, flags.gfd.outputFile;
  /etc/kubernetes/node-feature-discovery/features.d/gfd
- machine type file: `--machine-type-file`, GFD_MACHINE_TYPE_FILE, flags.gfd.machineTypeFile;
  /sys/class/dmi/id/product_name
- NodeFeature API: `--use-node-feature-api`, GFD_USE_NODE_FEATURE_API or USE_NODE_FEATURE_API,
  flags.useNodeFeatureAPI; true

A sleep interval is a Go duration ("60s", "1m30s"; a number in the file is nanoseconds, as Go reads it)
or `infinite`: label once, then sleep until a signal. The config file has been validated by the config
loader before these are read (config/sections.py checks every `flags.gfd` value).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass

from nvidia_device_plugin.base.errors import DevicePluginError
from nvidia_device_plugin.cli.common import env_value
from nvidia_device_plugin.config.durations import parse_go_duration
from nvidia_device_plugin.config.flags import config_source
from nvidia_device_plugin.config.loader import read_config_document
from nvidia_device_plugin.labels.nfd import DEFAULT_MACHINE_TYPE_FILE, DEFAULT_OUTPUT_FILE

INFINITE = "infinite"
_TRUE = {"1", "t", "true"}
_FALSE = {"0", "f", "false"}

# dest -> (flag, environment variables (first set wins), key under flags.gfd, or a path from `flags`)
_SOURCES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "oneshot": ("--oneshot", ("GFD_ONESHOT",), ("gfd", "oneshot")),
    "no_timestamp": ("--no-timestamp", ("GFD_NO_TIMESTAMP",), ("gfd", "noTimestamp")),
    "sleep_interval": ("--sleep-interval", ("GFD_SLEEP_INTERVAL",), ("gfd", "sleepInterval")),
    "output_file": ("--output-file", ("GFD_OUTPUT_FILE",), ("gfd", "outputFile")),
    "machine_type_file": ("--machine-type-file", ("GFD_MACHINE_TYPE_FILE",), ("gfd", "machineTypeFile")),
    "use_node_feature_api": (
        "--use-node-feature-api",
        ("GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API"),
        ("useNodeFeatureAPI",),
    ),
}
_DEFAULTS: dict[str, object] = {
    "oneshot": False,
    "no_timestamp": False,
    "sleep_interval": "60s",
    "output_file": DEFAULT_OUTPUT_FILE,
    "machine_type_file": DEFAULT_MACHINE_TYPE_FILE,
    "use_node_feature_api": True,
}
_WHAT = {
    "oneshot": "label once and exit",
    "no_timestamp": "leave out nvidia.com/gfd.timestamp",
    "sleep_interval": "time between labelling passes, a Go duration or 'infinite' (label once and sleep)",
    "output_file": "the features.d file, when the NodeFeature API is not used",
    "machine_type_file": "where nvidia.com/gpu.machine is read",
    "use_node_feature_api": "publish NFD's NodeFeature object instead of the features.d file",
}
# GFD's aliases of variables this image's shared config flags read (urfave: the first one set wins).
ENV_ALIASES = (
    ("GFD_MIG_STRATEGY", "MIG_STRATEGY"),
    ("GFD_FAIL_ON_INIT_ERROR", "FAIL_ON_INIT_ERROR"),
    ("GFD_CONFIG_FILE", "CONFIG_FILE"),
)


@dataclass(frozen=True)
class GfdSettings:
    oneshot: bool
    no_timestamp: bool
    sleep_interval: float | None  # seconds; None: infinite (label once, then sleep until a signal)
    output_file: str
    machine_type_file: str
    use_node_feature_api: bool


def add_gfd_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the table above; each defaults to None ("not given": the environment or file decides)."""
    for dest in ("oneshot", "no_timestamp", "use_node_feature_api"):
        flag, env, _ = _SOURCES[dest]
        parser.add_argument(
            flag, dest=dest, nargs="?", const="true", default=None, metavar="BOOL", help=_help(dest, env)
        )
    parser.add_argument(
        "--sleep-interval", default=None, help=_help("sleep_interval", _SOURCES["sleep_interval"][1])
    )
    for dest, short in (("output_file", ["-o", "--output"]), ("machine_type_file", [])):
        flag, env, _ = _SOURCES[dest]
        parser.add_argument(flag, *short, dest=dest, default=None, metavar="PATH", help=_help(dest, env))


def _help(dest: str, env: tuple[str, ...]) -> str:
    default = _DEFAULTS[dest]
    shown = str(default).lower() if isinstance(default, bool) else default
    where = f"env {', '.join(env)}; config flags.{'.'.join(_SOURCES[dest][2])}"
    return f"{_WHAT[dest]} (default {shown}) [{where}]"


def with_gfd_env_aliases(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with GFD's GFD_* spellings copied over the shared names they alias (they win, as in GFD)."""
    env = dict(environ)
    for alias, name in ENV_ALIASES:
        value = env_value(env, alias)
        if value is not None:
            env[name] = value
    return env


def resolve_gfd_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> GfdSettings:
    """Flag > environment > config file > default, for every setting of the table."""
    file_flags = _file_flags(args, environ)
    chosen: dict[str, tuple[object, str]] = {}
    for dest, (flag, env, path) in _SOURCES.items():
        given = getattr(args, dest, None)
        named = next((n for n in env if env_value(environ, n) is not None), None)
        if given is not None:
            chosen[dest] = (given, flag)
        elif named is not None:
            chosen[dest] = (environ[named], f"env {named}")
        elif (value := _at(file_flags, path)) is not None:
            chosen[dest] = (value, f"flags.{'.'.join(path)} in the config file")
        else:
            chosen[dest] = (_DEFAULTS[dest], "the default")
    return GfdSettings(
        oneshot=_bool(*chosen["oneshot"]),
        no_timestamp=_bool(*chosen["no_timestamp"]),
        sleep_interval=_interval(*chosen["sleep_interval"]),
        output_file=str(chosen["output_file"][0]),
        machine_type_file=str(chosen["machine_type_file"][0]),
        use_node_feature_api=_bool(*chosen["use_node_feature_api"]),
    )


def _file_flags(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, object]:
    """The config file's `flags` mapping ({} without a file)."""
    path = config_source(args, environ).resolve()
    document = read_config_document(path) if path is not None else None
    flags = document.get("flags") if isinstance(document, dict) else None
    return flags if isinstance(flags, dict) else {}


def _at(mapping: dict[str, object], path: tuple[str, ...]) -> object:
    value: object = mapping
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _bool(value: object, origin: str) -> bool:
    """A boolean as Go's strconv.ParseBool reads GFD's flags and variables (a YAML boolean in the file)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise DevicePluginError(f"{origin} must be true or false, got {value!r}")


def _interval(value: object, origin: str) -> float | None:
    if value == INFINITE:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds: float | None = value / 1e9  # Go's time.Duration in a YAML/JSON number: nanoseconds
    else:
        seconds = parse_go_duration(str(value))
    if seconds is None or seconds <= 0:
        raise DevicePluginError(
            f"{origin}: the sleep interval must be a positive duration such as 60s or 1m30s, or "
            f"'{INFINITE}', got {value!r}"
        )
    return seconds

"""Decoded YAML/JSON documents -> the frozen v1 `Config`, with errors that name the field and the bad value.

The format is NVIDIA k8s-device-plugin's `version: v1` (api/config/v1 in their repository). Where this loader
deliberately differs from NVIDIA's:

- Unknown keys are errors that name the path and suggest the closest known key. NVIDIA ignores them, so a
  misspelt `passDeviceSpec` silently does nothing there.
- `replicas: 1` is accepted (older NVIDIA releases accepted it, newer ones require >= 2); one replica means
  the resource is advertised as shared without being multiplied, handy for `renameByDefault` roll-outs.
- An empty `devices: []` list, an empty `pattern`, two entries of one sharing list with the same resource
  name, and more than `MAX_REPLICAS` replicas are errors: each can only be a mistake.
- Device references given as UUIDs are lower-cased and indices are written canonically ("00" -> "0"), so they
  compare equal to what NVML reports.

Where NVIDIA's behaviour is kept on purpose:

- A missing or empty `version` means v1; empty or null sections mean their defaults.
- `nvidiaDevRoot` defaults to `nvidiaDriverRoot` when unset.
- `sharing.mps.failRequestsGreaterThanOne` defaults to true (NVIDIA's historical MPS behaviour), the
  time-slicing one to false.
- A present but empty sharing `resources` list is an error ("no resources specified").
- `health.ignoredXIDs`, `health.eventTypes`: a non-empty list REPLACES the default; an empty list keeps the
  default (NVIDIA's Health.Merge: only non-empty values from the higher-priority source override).
  `health.criticalXIDs` is "all" (every XID that is not ignored) or a list; an XID in both explicit lists
  is an error, as in NVIDIA's Health.Validate.
- `imex` is parsed and validated (`channelIDs` must be [] or [0]) but not acted on: this plugin does not
  inject IMEX channels.
- GFD-only flags (`flags.gfd.*`, `useNodeFeatureAPI`) and flags we do not act on (`deviceDiscoveryStrategy`,
  `plugin.kubeletSocket`, `plugin.cdiFeatureFlags`) are type-checked and otherwise ignored, so shared
  ConfigMaps load.
- Duplicate YAML keys: the last one wins (as with sigs.k8s.io/yaml), PyYAML's YAML 1.1 booleans (`yes`) are
  booleans.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import yaml

from nvidia_device_plugin.config.v1 import (
    DEVICE_ID_STRATEGIES,
    DEVICE_LIST_STRATEGIES,
    HEALTH_EVENT_TYPES,
    MIG_STRATEGIES,
    RESOURCE_PREFIX,
    SHARED_SUFFIX,
    VERSION,
    Config,
    Flags,
    Health,
    Imex,
    PluginFlags,
    Recovery,
    ReplicatedDevices,
    ReplicatedResource,
    ReplicatedResources,
    ResourcePattern,
    Resources,
    Sharing,
)
from nvidia_device_plugin.errors import ConfigError

MAX_RESOURCE_NAME_LENGTH = 63
# NVIDIA sets no limit; a typo like 100000 would make us advertise millions of device IDs, so we refuse it.
MAX_REPLICAS = 4096
DEVICE_DISCOVERY_STRATEGIES = ("auto", "nvml", "tegra")
IMEX_CHANNEL_CONFIGS = ((), (0,))

_PREFIX = RESOURCE_PREFIX + "/"
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_UUID = r"(?:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9a-fA-F]{32})"
_GPU_UUID = re.compile(rf"GPU-{_UUID}")
_MIG_UUID = re.compile(rf"MIG-{_UUID}")
_MIG_GPU_UUID = re.compile(rf"MIG-GPU-{_UUID}/[0-9]+/[0-9]+")
_GPU_INDEX = re.compile(r"[0-9]+")
_MIG_INDEX = re.compile(r"([0-9]+):([0-9]+)")
_DURATION_PART = re.compile(
    r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)"
)  # Go accepts both spellings of micro
_DURATION_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_MAX_XID = 2**64 - 1

_TOP_FIELDS = ("version", "flags", "resources", "sharing", "health", "imex")
_FLAG_FIELDS = (
    "migStrategy",
    "failOnInitError",
    "restartOnDeviceUnhealthy",
    "nvidiaDriverRoot",
    "nvidiaDevRoot",
    "mpsRoot",
    "gdsEnabled",
    "mofedEnabled",
    "gdrcopyEnabled",
    "useNodeFeatureAPI",
    "deviceDiscoveryStrategy",
    "resourceNamePrefix",
    "plugin",
    "gfd",
)
_PLUGIN_FIELDS = (
    "passDeviceSpecs",
    "deviceListStrategy",
    "deviceIDStrategy",
    "cdiAnnotationPrefix",
    "nvidiaCTKPath",
    "nvidiaCDIHookPath",
    "containerDriverRoot",
    "kubeletSocket",
    "cdiFeatureFlags",
)
_GFD_FIELDS = ("oneshot", "noTimestamp", "noCleanupOnExit", "sleepInterval", "outputFile", "machineTypeFile")
_RESOURCES_FIELDS = ("gpus", "mig")
_PATTERN_FIELDS = ("pattern", "name")
_SHARING_FIELDS = ("timeSlicing", "mps")
_REPLICATED_FIELDS = ("renameByDefault", "failRequestsGreaterThanOne", "resources")
_REPLICATED_RESOURCE_FIELDS = ("name", "rename", "devices", "replicas")
_HEALTH_FIELDS = ("disabled", "eventTypes", "ignoredXIDs", "criticalXIDs", "recovery")
_RECOVERY_FIELDS = ("enabled", "gracePeriod")
_IMEX_FIELDS = ("channelIDs", "required")

# Setting one of these paths from outside the file also drops the file's aliases for it.
_ALIASES = {"flags.plugin.nvidiaCTKPath": ("nvidiaCDIHookPath",)}


@dataclass(frozen=True)
class Override:
    """A value for one config path that comes from outside the file: a CLI flag or an environment variable."""

    value: object
    origin: str  # how errors name it, e.g. "flag --mig-strategy" or "env MIG_STRATEGY"


class _Invalid(Exception):
    """A problem at one path of the document; `text` is the complete sentence, starting with the path."""

    def __init__(self, path: str, text: str) -> None:
        super().__init__(text)
        self.path = path
        self.text = text


# ---------------------------------------------------------------------------------------------------------
# Public entry points


def parse_config(
    raw: object, source: str = "<config>", *, origins: Mapping[str, str] | None = None
) -> Config:
    """Validate a decoded document (YAML/JSON, None for an empty one) and build the `Config` it describes.

    `origins` maps config paths to where their value came from when it did not come from `source` (see
    `build_config`): an error under such a path is reported against that origin instead.
    """
    try:
        return _parse_document(raw)
    except _Invalid as exc:
        raise ConfigError(f"{_origin_of(exc.path, origins or {}) or source}: {exc.text}") from None


def parse_config_text(text: str, source: str = "<config>") -> Config:
    return parse_config(parse_document_text(text, source), source)


def load_config_file(path: str | os.PathLike[str]) -> Config:
    return parse_config(read_config_document(path), os.fspath(path))


def build_config(file_raw: object, overrides: Mapping[str, Override], source: str = "<config>") -> Config:
    """The file's document with `overrides` (config path -> value) written over it, then validated.

    Overrides are applied before validation so that a bad flag or environment value is reported with its own
    origin, e.g. "env MIG_STRATEGY: flags.migStrategy must be one of none, single, mixed, got 'mix'".
    """
    raw = apply_overrides(file_raw, overrides)
    return parse_config(raw, source, origins={path: o.origin for path, o in overrides.items()})


def apply_overrides(raw: object, overrides: Mapping[str, Override]) -> object:
    """A copy of `raw` with each override's value at its dotted path (missing mappings are created)."""
    doc = copy.deepcopy(raw) if raw is not None else {}
    if not isinstance(doc, dict):
        return doc  # the file itself is not a mapping; parsing reports that against the file
    for path, override in overrides.items():
        *parents, leaf = path.split(".")
        node: dict[object, object] = doc
        for key in parents:
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                break  # the file's own value here has the wrong type; parsing reports it against the file
            node = child
        else:
            node[leaf] = override.value
            for alias in _ALIASES.get(path, ()):
                node.pop(alias, None)
    return doc


def read_config_document(path: str | os.PathLike[str]) -> object:
    """The decoded document in a YAML or JSON file (None when the file is empty)."""
    source = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{source}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{source}: is a directory, not a config file") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read config file: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{source}: config file is not UTF-8 text (bad byte at offset {exc.start})"
        ) from None
    return parse_document_text(text, source)


def parse_document_text(text: str, source: str = "<config>") -> object:
    """YAML (or JSON) text -> the decoded document; syntax errors become ConfigErrors with the line number."""
    if text.lstrip().startswith("{"):
        # JSON first: PyYAML is YAML 1.1 and trips over some valid JSON (tabs, for one).
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass  # a YAML flow mapping also starts with "{"; let the YAML parser judge it
        except (ValueError, RecursionError) as exc:
            raise ConfigError(f"{source}: the document cannot be read: {exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "syntax error"
        raise ConfigError(f"{source}: invalid YAML{where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer literal beyond Python's digit limit
        raise ConfigError(f"{source}: the document cannot be read: {exc}") from None


def qualify_resource_name(name: str) -> str:
    """`name` with the `nvidia.com/` prefix added when missing, checked as NVIDIA's NewResourceName does."""
    try:
        return _qualified_name(name, "name")
    except _Invalid as exc:
        raise ConfigError(exc.text) from None


def parse_go_duration(text: str) -> float | None:
    """Seconds in a Go duration string ("90s", "1m30s", "1.5h", "300ms"); None when `text` is not one."""
    sign = 1.0
    body = text
    if body[:1] in ("+", "-"):
        sign = -1.0 if body[0] == "-" else 1.0
        body = body[1:]
    if body == "0":
        return 0.0
    if not body:
        return None
    total = 0.0
    pos = 0
    while pos < len(body):
        match = _DURATION_PART.match(body, pos)
        if match is None or match.group(1) in ("", "."):
            return None
        total += float(match.group(1)) * _DURATION_UNIT_SECONDS[match.group(2)]
        pos = match.end()
    return sign * total


# ---------------------------------------------------------------------------------------------------------
# Reporting helpers


def _origin_of(path: str, origins: Mapping[str, str]) -> str | None:
    """The origin of the longest overridden path that `path` is, or lies under."""
    best: tuple[int, str] | None = None
    for prefix, origin in origins.items():
        under = path == prefix or path.startswith((prefix + ".", prefix + "["))
        if under and (best is None or len(prefix) > best[0]):
            best = (len(prefix), origin)
    return best[1] if best is not None else None


def _show(value: object, depth: int = 0) -> str:
    """A short YAML-flavoured rendering of a bad value, for error messages."""
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        try:
            text = repr(value)
        except ValueError:
            return "a very large integer"
        return text if len(text) <= 40 else text[:20] + "..."
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Mapping):
        if depth >= 1:
            return "{...}" if value else "{}"
        items = [f"{_show(k, depth + 1)}: {_show(v, depth + 1)}" for k, v in list(value.items())[:4]]
        return "{" + ", ".join(items) + (", ..." if len(value) > 4 else "") + "}"
    if isinstance(value, (list, tuple)):
        if depth >= 1:
            return "[...]" if value else "[]"
        shown = [_show(v, depth + 1) for v in value[:6]]
        return "[" + ", ".join(shown) + (", ..." if len(value) > 6 else "") + "]"
    return f"a {type(value).__name__} ({str(value)[:40]})"


def _key_text(key: object) -> str:
    return key if isinstance(key, str) else _show(key)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _fail(path: str, message: str) -> NoReturn:
    raise _Invalid(path, f"{path}: {message}")


def _fail_type(path: str, expected: str, value: object) -> NoReturn:
    raise _Invalid(path, f"{path} must be {expected}, got {_show(value)}")


def _fail_choice(path: str, choices: Sequence[str], value: object, hint: str = "") -> NoReturn:
    raise _Invalid(path, f"{path} must be one of {', '.join(choices)}, got {_show(value)}{hint}")


def _unknown_field(path: str, key: object, known: Sequence[str]) -> NoReturn:
    child = _join(path, _key_text(key))
    suggestion: list[str] = []
    if isinstance(key, str):
        suggestion = [k for k in known if k.lower() == key.lower()] or difflib.get_close_matches(
            key, known, n=1
        )
    if suggestion:
        _fail(child, f"unknown field (did you mean {suggestion[0]}?)")
    _fail(child, f"unknown field (known fields here: {', '.join(known)})")


class _Section:
    """One mapping of the document with its path; typed getters name the field and value on error.

    A missing key and an explicit null both mean "not given", as they do for NVIDIA's pointer fields.
    """

    def __init__(self, value: object, path: str, known: Sequence[str]) -> None:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            if not path:
                raise _Invalid(path, f"the config must be a mapping of keys to values, got {_show(value)}")
            _fail_type(path, "a mapping", value)
        for key in value:
            if not isinstance(key, str) or key not in known:
                _unknown_field(path, key, known)
        self._values: dict[str, object] = value
        self.path = path

    def path_of(self, key: str) -> str:
        return _join(self.path, key)

    def raw(self, key: str) -> object:
        return self._values.get(key)

    def section(self, key: str, known: Sequence[str]) -> _Section:
        return _Section(self._values.get(key), self.path_of(key), known)

    def get_bool(self, key: str, default: bool) -> bool:
        value = self._values.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            _fail_type(self.path_of(key), "a boolean", value)
        return value

    def get_str(self, key: str, default: str) -> str:
        value = self._values.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            _fail_type(self.path_of(key), "a string", value)
        return value

    def optional_str(self, key: str) -> str | None:
        value = self._values.get(key)
        if value is not None and not isinstance(value, str):
            _fail_type(self.path_of(key), "a string", value)
        return value

    def required_str(self, key: str) -> str:
        value = self._values.get(key)
        if value is None:
            _fail(self.path_of(key), "required field is missing")
        if not isinstance(value, str):
            _fail_type(self.path_of(key), "a string", value)
        return value

    def required_int(self, key: str) -> int:
        value = self._values.get(key)
        if value is None:
            _fail(self.path_of(key), "required field is missing")
        if isinstance(value, bool) or not isinstance(value, int):
            _fail_type(self.path_of(key), "an integer", value)
        return value

    def get_choice(self, key: str, choices: Sequence[str], default: str) -> str:
        value = self.get_str(key, default)
        if value not in choices:
            _fail_choice(self.path_of(key), choices, value)
        return value

    def get_list(self, key: str) -> list[object] | None:
        value = self._values.get(key)
        if value is None:
            return None
        if not isinstance(value, list):
            _fail_type(self.path_of(key), "a list", value)
        return value


# ---------------------------------------------------------------------------------------------------------
# The document


def _parse_document(raw: object) -> Config:
    doc = _Section(raw, "", _TOP_FIELDS)
    version = doc.raw("version")
    if version is not None and not isinstance(version, str):
        _fail_type("version", "a string", version)
    if version not in (None, "", VERSION):
        _fail("version", f"unsupported config version {version!r} (supported: {VERSION})")
    flags = _parse_flags(doc.section("flags", _FLAG_FIELDS))
    resources = _parse_resources(doc.section("resources", _RESOURCES_FIELDS))
    sharing = _parse_sharing(doc.section("sharing", _SHARING_FIELDS))
    health = _parse_health(doc.section("health", _HEALTH_FIELDS))
    imex = _parse_imex(doc.section("imex", _IMEX_FIELDS))
    _check_sharing_against_flags(sharing, flags)
    return Config(
        version=VERSION, flags=flags, resources=resources, sharing=sharing, health=health, imex=imex
    )


def _parse_flags(s: _Section) -> Flags:
    d = Flags()
    driver_root = s.get_str("nvidiaDriverRoot", d.nvidia_driver_root)
    # As NVIDIA does: the device nodes live under the driver root unless told otherwise.
    dev_root = s.get_str("nvidiaDevRoot", "") or driver_root
    s.get_bool("useNodeFeatureAPI", False)  # GFD only
    # Older NVIDIA releases restarted the plugin on an unhealthy device; health changes are pushed
    # over ListAndWatch here, so the flag is accepted (old ConfigMaps load) and has nothing to do.
    s.get_bool("restartOnDeviceUnhealthy", False)
    s.get_choice(
        "deviceDiscoveryStrategy", DEVICE_DISCOVERY_STRATEGIES, "auto"
    )  # discovery is always NVML here
    prefix = s.get_str("resourceNamePrefix", RESOURCE_PREFIX)
    if prefix not in ("", RESOURCE_PREFIX):
        _fail(s.path_of("resourceNamePrefix"), f"only {RESOURCE_PREFIX!r} is supported, got {prefix!r}")
    _check_gfd_flags(s.section("gfd", _GFD_FIELDS))
    return Flags(
        mig_strategy=s.get_choice("migStrategy", MIG_STRATEGIES, d.mig_strategy),
        fail_on_init_error=s.get_bool("failOnInitError", d.fail_on_init_error),
        nvidia_driver_root=driver_root,
        nvidia_dev_root=dev_root,
        mps_root=s.get_str("mpsRoot", d.mps_root),
        gds_enabled=s.get_bool("gdsEnabled", d.gds_enabled),
        mofed_enabled=s.get_bool("mofedEnabled", d.mofed_enabled),
        gdrcopy_enabled=s.get_bool("gdrcopyEnabled", d.gdrcopy_enabled),
        plugin=_parse_plugin_flags(s.section("plugin", _PLUGIN_FIELDS)),
    )


def _parse_plugin_flags(s: _Section) -> PluginFlags:
    d = PluginFlags()
    ctk_path = s.optional_str("nvidiaCTKPath")
    hook_path = s.optional_str("nvidiaCDIHookPath")
    if ctk_path is not None and hook_path is not None and ctk_path != hook_path:
        _fail(
            s.path_of("nvidiaCDIHookPath"),
            f"{hook_path!r} contradicts {s.path_of('nvidiaCTKPath')} {ctk_path!r} (one setting; give one)",
        )
    s.optional_str("kubeletSocket")  # the socket is a command-line matter here
    feature_flags = s.raw("cdiFeatureFlags")
    if feature_flags is not None and not isinstance(feature_flags, str):
        _string_list(feature_flags, s.path_of("cdiFeatureFlags"))
    return PluginFlags(
        pass_device_specs=s.get_bool("passDeviceSpecs", d.pass_device_specs),
        device_list_strategy=_device_list_strategy(s, d.device_list_strategy),
        device_id_strategy=s.get_choice("deviceIDStrategy", DEVICE_ID_STRATEGIES, d.device_id_strategy),
        cdi_annotation_prefix=s.get_str("cdiAnnotationPrefix", d.cdi_annotation_prefix),
        nvidia_ctk_path=ctk_path or hook_path or d.nvidia_ctk_path,
        container_driver_root=s.get_str("containerDriverRoot", d.container_driver_root),
    )


def _device_list_strategy(s: _Section, default: tuple[str, ...]) -> tuple[str, ...]:
    key = "deviceListStrategy"
    value = s.raw(key)
    path = s.path_of(key)
    if value is None:
        return default
    if isinstance(value, str):
        items: list[tuple[str, object]] = [(path, value)]
    elif isinstance(value, list):
        items = [(f"{path}[{i}]", item) for i, item in enumerate(value)]
    else:
        _fail_type(path, "a string or a list of strings", value)
    if not items:
        _fail(path, f"name at least one strategy ({', '.join(DEVICE_LIST_STRATEGIES)})")
    strategies: list[str] = []
    for item_path, item in items:
        if not isinstance(item, str):
            _fail_type(item_path, "a string", item)
        if item not in DEVICE_LIST_STRATEGIES:
            hint = " (write several strategies as a YAML list)" if "," in item else ""
            _fail_choice(item_path, DEVICE_LIST_STRATEGIES, item, hint)
        strategies.append(item)
    return tuple(dict.fromkeys(strategies))


def _check_gfd_flags(s: _Section) -> None:
    for key in ("oneshot", "noTimestamp", "noCleanupOnExit"):
        s.get_bool(key, False)
    for key in ("outputFile", "machineTypeFile"):
        s.optional_str(key)
    interval = s.raw("sleepInterval")
    if interval is None:
        return
    # A number is nanoseconds for NVIDIA's Go Duration; we only check that it is one.
    if isinstance(interval, bool) or not isinstance(interval, (int, float, str)):
        _fail_type(s.path_of("sleepInterval"), "a duration such as '60s'", interval)
    if isinstance(interval, str) and parse_go_duration(interval) is None:
        _fail_type(s.path_of("sleepInterval"), "a duration such as '60s'", interval)


# ---------------------------------------------------------------------------------------------------------
# Resource names and patterns


def _qualified_name(name: str, path: str) -> str:
    full = name if name.startswith(_PREFIX) else _PREFIX + name
    if len(full) > MAX_RESOURCE_NAME_LENGTH:
        _fail(
            path,
            f"resource name {full!r} is {len(full)} characters long; the limit is {MAX_RESOURCE_NAME_LENGTH}",
        )
    if not _DNS_SUBDOMAIN.fullmatch(full[len(_PREFIX) :]):
        _fail(
            path,
            f"{name!r} is not a valid resource name: after {_PREFIX!r} it must be lower-case letters, "
            "digits, '-' and '.', starting and ending with a letter or digit",
        )
    return full


def _parse_resources(s: _Section) -> Resources:
    return Resources(gpus=_parse_patterns(s, "gpus"), mig=_parse_patterns(s, "mig"))


def _parse_patterns(s: _Section, key: str) -> tuple[ResourcePattern, ...]:
    entries = s.get_list(key) or []
    patterns: list[ResourcePattern] = []
    for i, item in enumerate(entries):
        entry = _Section(item, f"{s.path_of(key)}[{i}]", _PATTERN_FIELDS)
        pattern = entry.required_str("pattern")
        if not pattern:
            _fail(entry.path_of("pattern"), "must not be empty (use '*' to match every device)")
        name = _qualified_name(entry.required_str("name"), entry.path_of("name"))
        patterns.append(ResourcePattern(pattern=pattern, name=name))
    return tuple(patterns)


# ---------------------------------------------------------------------------------------------------------
# Sharing


def _parse_sharing(s: _Section) -> Sharing:
    time_slicing = ReplicatedResources()
    if s.raw("timeSlicing") is not None:
        time_slicing = _parse_replicated(s.section("timeSlicing", _REPLICATED_FIELDS), fail_default=False)
    mps = None
    if s.raw("mps") is not None:
        mps = _parse_replicated(s.section("mps", _REPLICATED_FIELDS), fail_default=True)
    return Sharing(time_slicing=time_slicing, mps=mps)


def _parse_replicated(s: _Section, fail_default: bool) -> ReplicatedResources:
    rename_by_default = s.get_bool("renameByDefault", False)
    fail_requests = s.get_bool("failRequestsGreaterThanOne", fail_default)
    list_path = s.path_of("resources")
    entries = s.get_list("resources")
    if not entries:
        _fail(list_path, f"no resources specified (list at least one resource to share, or remove {s.path})")
    listed: dict[str, int] = {}  # resource name -> entry index
    advertised: dict[str, tuple[int, int]] = {}  # advertised name -> (replicas, entry index)
    resources: list[ReplicatedResource] = []
    for i, item in enumerate(entries):
        entry = _Section(item, f"{list_path}[{i}]", _REPLICATED_RESOURCE_FIELDS)
        name = _qualified_name(entry.required_str("name"), entry.path_of("name"))
        if name in listed:
            _fail(
                entry.path_of("name"),
                f"{name!r} is already listed at {list_path}[{listed[name]}]; list it once",
            )
        listed[name] = i
        replicas = entry.required_int("replicas")
        replicas_path = entry.path_of("replicas")
        if replicas < 1:
            raise _Invalid(replicas_path, f"{replicas_path} must be >= 1, got {replicas}")
        if replicas > MAX_REPLICAS:
            _fail(
                replicas_path,
                f"at most {MAX_REPLICAS} replicas per device (each is a device for kubelet to track), "
                f"got {_show(replicas)}",
            )
        rename_raw = entry.optional_str("rename")
        rename = None if rename_raw is None else _qualified_name(rename_raw, entry.path_of("rename"))
        if rename is None and rename_by_default:
            rename = _default_shared_name(name, entry.path_of("name"))
        final = rename or name
        if final in advertised and advertised[final][0] != replicas:
            other_replicas, other = advertised[final]
            _fail(
                entry.path_of("replicas"),
                f"{final!r} is also advertised by {list_path}[{other}] with {other_replicas} replicas; "
                f"entries advertised under one name need one replica count, got {replicas}",
            )
        advertised.setdefault(final, (replicas, i))
        devices = _parse_devices(entry.raw("devices"), entry.path_of("devices"))
        resources.append(ReplicatedResource(name=name, replicas=replicas, rename=rename, devices=devices))
    return ReplicatedResources(
        rename_by_default=rename_by_default,
        fail_requests_greater_than_one=fail_requests,
        resources=tuple(resources),
    )


def _default_shared_name(name: str, path: str) -> str:
    shared = name + SHARED_SUFFIX
    if len(shared) > MAX_RESOURCE_NAME_LENGTH:
        _fail(
            path,
            f"renameByDefault makes {shared!r}, which is {len(shared)} characters long; the limit is "
            f"{MAX_RESOURCE_NAME_LENGTH} (give this entry a shorter explicit rename)",
        )
    return shared


def _parse_devices(value: object, path: str) -> ReplicatedDevices:
    expected = "'all', a positive device count, or a list of GPU/MIG indices or UUIDs"
    if value is None or value == "all":
        return ReplicatedDevices()
    if isinstance(value, (bool, str)):
        _fail_type(path, expected, value)
    if isinstance(value, int):
        if value <= 0:
            _fail(path, f"a device count must be > 0, got {value}")
        return ReplicatedDevices(all=False, count=value)
    if isinstance(value, list):
        if not value:
            _fail(path, "the device list is empty (use 'all' to share every device)")
        refs = tuple(_device_ref(item, f"{path}[{i}]") for i, item in enumerate(value))
        return ReplicatedDevices(all=False, refs=tuple(dict.fromkeys(refs)))
    _fail_type(path, expected, value)


def _device_ref(value: object, path: str) -> str:
    """A device reference in the one spelling NVML would report: "3", "3:1", "GPU-<uuid>", "MIG-<uuid>"."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str):
        if _GPU_INDEX.fullmatch(value):
            return str(int(value))
        mig_index = _MIG_INDEX.fullmatch(value)
        if mig_index:
            return f"{int(mig_index.group(1))}:{int(mig_index.group(2))}"
        if _MIG_GPU_UUID.fullmatch(value):
            return "MIG-GPU-" + value[len("MIG-GPU-") :].lower()
        if _GPU_UUID.fullmatch(value) or _MIG_UUID.fullmatch(value):
            return value[:4] + value[4:].lower()
    _fail_type(path, "a GPU index (0), MIG index (0:1), GPU UUID (GPU-...) or MIG UUID (MIG-...)", value)


def _check_sharing_against_flags(sharing: Sharing, flags: Flags) -> None:
    # NVIDIA refuses the same two combinations at start-up.
    if sharing.strategy != "mps":
        return
    if flags.mig_strategy == "mixed":
        _fail("flags.migStrategy", "'mixed' cannot be combined with sharing.mps (MPS shares whole GPUs only)")
    if not flags.mps_root:
        _fail("flags.mpsRoot", "must not be empty when sharing.mps is configured")


# ---------------------------------------------------------------------------------------------------------
# Health and IMEX


def _parse_health(s: _Section) -> Health:
    d = Health()
    event_types = _string_list(s.raw("eventTypes"), s.path_of("eventTypes"))
    for i, name in enumerate(event_types):
        if name not in HEALTH_EVENT_TYPES:
            _fail_choice(f"{s.path_of('eventTypes')}[{i}]", HEALTH_EVENT_TYPES, name)
    ignored = _xid_list(s.raw("ignoredXIDs"), s.path_of("ignoredXIDs"))
    critical_raw = s.raw("criticalXIDs")
    critical_path = s.path_of("criticalXIDs")
    critical: frozenset[int] | None = None
    if isinstance(critical_raw, str):
        if critical_raw.lower() != "all":
            _fail_type(critical_path, "'all' or a list of XIDs", critical_raw)
    elif critical_raw is not None:
        if not isinstance(critical_raw, list):
            _fail_type(critical_path, "'all' or a list of XIDs", critical_raw)
        critical_list = _xid_list(critical_raw, critical_path)
        conflicts = sorted(set(critical_list) & set(ignored))
        if conflicts:
            _fail(critical_path, f"XID {conflicts[0]} is also in {s.path_of('ignoredXIDs')}; pick one list")
        critical = frozenset(critical_list)
    return Health(
        disabled=s.get_bool("disabled", d.disabled),
        event_types=tuple(dict.fromkeys(event_types)) or d.event_types,
        ignored_xids=frozenset(ignored) or d.ignored_xids,
        critical_xids=critical,
        recovery=_parse_recovery(s.section("recovery", _RECOVERY_FIELDS)),
    )


def _parse_recovery(s: _Section) -> Recovery:
    d = Recovery()
    return Recovery(
        enabled=s.get_bool("enabled", d.enabled),
        grace_period_seconds=_seconds(s.raw("gracePeriod"), s.path_of("gracePeriod"), d.grace_period_seconds),
    )


def _seconds(value: object, path: str, default: float) -> float:
    """A number of seconds, or a Go duration string ("5m"); >= 0."""
    expected = "a number of seconds or a duration such as '5m'"
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        _fail_type(path, expected, value)
    try:
        seconds = parse_go_duration(value) if isinstance(value, str) else float(value)
    except OverflowError:  # an integer too large for a float
        seconds = math.inf
    if seconds is None or not math.isfinite(seconds):
        _fail_type(path, expected, value)
    if seconds < 0:
        _fail(path, f"must not be negative, got {_show(value)}")
    return seconds


def _xid_list(value: object, path: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list):
        _fail_type(path, "a list of XIDs (non-negative integers)", value)
    xids: list[int] = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= _MAX_XID:
            _fail_type(f"{path}[{i}]", "an XID (a non-negative integer)", item)
        xids.append(item)
    return xids


def _string_list(value: object, path: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        _fail_type(path, "a list of strings", value)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            _fail_type(f"{path}[{i}]", "a string", item)
    return list(value)


def _parse_imex(s: _Section) -> Imex:
    path = s.path_of("channelIDs")
    raw = s.get_list("channelIDs") or []
    ids: list[int] = []
    for i, item in enumerate(raw):
        if isinstance(item, bool) or not isinstance(item, int):
            _fail_type(f"{path}[{i}]", "an integer channel ID", item)
        ids.append(item)
    if tuple(ids) not in IMEX_CHANNEL_CONFIGS:
        _fail(path, f"must be [] or [0] (the IMEX channel settings NVIDIA supports), got {_show(raw)}")
    return Imex(channel_ids=tuple(ids), required=s.get_bool("required", False))

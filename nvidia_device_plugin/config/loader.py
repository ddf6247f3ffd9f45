"""The config API: a file, text or decoded document (plus flag/env overrides) -> the frozen v1 `Config`.

Errors name the field and the bad value. The work is split by job: config.document reads and decodes
(bounded, non-blocking), config.schema knows the keys of each section, config.sections and
config.resource_sections read each section into its v1 type, and the v1 types refuse the values no config
may hold. Everything that goes wrong while loading is a ConfigError, never another
exception, so a reload can reject a bad config and keep serving the last good one.

The format is NVIDIA k8s-device-plugin's `version: v1` (api/config/v1 in their repository). Where this loader
deliberately differs from NVIDIA's:

- Unknown keys name the path and suggest the closest known key (config.schema). With `strict` (the
  default, and check-config) they are errors; the daemon loads with `strict=False`, so that, as with NVIDIA,
  a stray key does not stop the plugin, but each one is a `Config.warnings` entry that the daemon logs and
  exports as a metric, where NVIDIA says nothing (a misspelt `passDeviceSpec` silently does nothing there).
- Keys that differ from a known key only in case are accepted, as NVIDIA accepts them, with a warning
  naming the canonical spelling.
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
- `imex.channelIDs` must be [] or [0], as for NVIDIA (Allocate injects the channel; see serving/allocate.py).
- GFD-only flags (`flags.gfd.*` with every value GFD takes, `sleepInterval: infinite` too;
  `useNodeFeatureAPI`) and `plugin.kubeletSocket` are type-checked and otherwise ignored, so shared
  ConfigMaps load. `deviceDiscoveryStrategy` is kept; discovery is NVML whatever it says.
- Duplicate YAML keys: the last one wins (as with sigs.k8s.io/yaml), PyYAML's YAML 1.1 booleans (`yes`) are
  booleans.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.document import (
    MAX_CONFIG_BYTES,
    Invalid,
    Problems,
    check_document_shape,
    origin_of,
    parse_document_text,
    read_config_document,
)
from nvidia_device_plugin.config.durations import parse_go_duration
from nvidia_device_plugin.config.resource_sections import qualified_name
from nvidia_device_plugin.config.schema import ALIASES, KeyNotes
from nvidia_device_plugin.config.sections import parse_document
from nvidia_device_plugin.config.v1 import MAX_REPLICAS, Config

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_REPLICAS",
    "ConfigProblems",
    "Override",
    "apply_overrides",
    "build_config",
    "gfd_incompatibilities",
    "load_config_file",
    "parse_config",
    "parse_config_text",
    "parse_document_text",
    "parse_go_duration",
    "qualify_resource_name",
    "read_config_document",
]


class ConfigProblems(ConfigError):
    """Every mistake found in one config: `problems` holds (origin, sentence) pairs, the origin being the
    file or the flag or variable the value came from. The message is one log line ("file: a; b"), `lines`
    one line per mistake (check-config prints those)."""

    def __init__(self, problems: tuple[tuple[str, str], ...]) -> None:
        self.problems = problems
        parts: list[str] = []
        for i, (origin, text) in enumerate(problems):
            same = i > 0 and problems[i - 1][0] == origin
            parts.append(text if same else f"{origin}: {text}")
        super().__init__("; ".join(parts))

    @property
    def lines(self) -> tuple[str, ...]:
        return tuple(f"{origin}: {text}" for origin, text in self.problems)


@dataclass(frozen=True)
class Override:
    """A value for one config path that comes from outside the file: a CLI flag or an environment variable."""

    value: object
    origin: str  # how errors name it, e.g. "flag --mig-strategy" or "env MIG_STRATEGY"


def parse_config(
    raw: object,
    source: str = "<config>",
    *,
    origins: Mapping[str, str] | None = None,
    strict: bool = True,
) -> Config:
    """Validate a decoded document (YAML/JSON, None for an empty one) and build the `Config` it describes.

    `origins` maps config paths to where their value came from when it did not come from `source` (see
    `build_config`): an error under such a path is reported against that origin instead. Unknown keys are
    errors when `strict`, else `Config.warnings` (their messages start with `source`).
    """
    try:
        check_document_shape(raw)
        config = parse_document(raw, KeyNotes(strict=strict))
    except Invalid as exc:
        raise ConfigError(f"{origin_of(exc.path, origins or {}) or source}: {exc.text}") from None
    except Problems as exc:
        raise ConfigProblems(
            tuple((origin_of(p.path, origins or {}) or source, p.text) for p in exc.problems)
        ) from None
    except RecursionError:  # the shape check makes this unreachable; kept so a reload can never crash
        raise ConfigError(f"{source}: the document is nested too deeply to read") from None
    warnings = tuple(replace(w, message=f"{source}: {w.message}") for w in config.warnings)
    return replace(config, warnings=warnings)


def parse_config_text(text: str, source: str = "<config>") -> Config:
    return parse_config(parse_document_text(text, source), source)


def load_config_file(path: str | os.PathLike[str]) -> Config:
    return parse_config(read_config_document(path), os.fspath(path))


def build_config(
    file_raw: object, overrides: Mapping[str, Override], source: str = "<config>", *, strict: bool = True
) -> Config:
    """The file's document with `overrides` (config path -> value) written over it, then validated.

    Overrides are applied before validation so that a bad flag or environment value is reported with its own
    origin, e.g. "env MIG_STRATEGY: flags.migStrategy must be one of none, single, mixed, got 'mix'".
    """
    try:
        check_document_shape(file_raw)  # before copying it: deepcopy recurses
    except Invalid as exc:
        raise ConfigError(f"{source}: {exc.text}") from None
    raw = apply_overrides(file_raw, overrides)
    origins = {path: o.origin for path, o in overrides.items()}
    return parse_config(raw, source, origins=origins, strict=strict)


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
            for alias in ALIASES.get(path, ()):
                node.pop(alias, None)
    return doc


def qualify_resource_name(name: str) -> str:
    """`name` with the `nvidia.com/` prefix added when missing, checked as NVIDIA's NewResourceName does."""
    try:
        return qualified_name(name, "name")
    except Invalid as exc:
        raise ConfigError(exc.text) from None


def gfd_incompatibilities(config: Config) -> tuple[str, ...]:
    """Why GPU Feature Discovery would refuse this config, which this plugin accepts (for check-config).

    GFD reads the same ConfigMap in NVIDIA's deployments and insists on at least 2 replicas per shared
    resource ("number of replicas must be >= 2"); `replicas: 1` is fine here.
    """
    problems: list[str] = []
    sharing = config.sharing
    for section, shared in (("timeSlicing", sharing.time_slicing), ("mps", sharing.mps)):
        for i, entry in enumerate(shared.resources if shared is not None else ()):
            if entry.replicas == 1:
                problems.append(
                    f"sharing.{section}.resources[{i}].replicas is 1: accepted here, but GPU Feature "
                    "Discovery refuses this file (number of replicas must be >= 2), so a ConfigMap shared "
                    "with GFD cannot use it"
                )
    return tuple(problems)

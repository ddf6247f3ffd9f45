"""Which config file a node gets: the value of its label, else NVIDIA's default and fallback rules.

Pure: given the label's value and the names present in the config directory it answers a `Selection` or
raises `ConfigSelectionError`. The config-manager process uses it, and so does the daemon's own config
source (config/source.py) for its fallbacks. The rules are NVIDIA's config-manager's:

1. A non-empty label value must name a config that exists; anything else is an error (never a silent
   fallback: a typo in a label must not give the node another config).
2. Without a label value, `default` (DEFAULT_CONFIG) is used when set; it too must exist.
3. Without either, the fallback strategies are tried in order: `named` takes the config called `default`,
   `single` takes the only config when there is exactly one, `empty` takes an empty config (the plugin's
   built-in defaults: whole GPUs, no sharing). The first that applies wins.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.base.errors import ConfigError

NAMED_DEFAULT_CONFIG = "default"


class FallbackStrategy(enum.StrEnum):
    NAMED = "named"
    SINGLE = "single"
    EMPTY = "empty"


DEFAULT_FALLBACK_STRATEGIES: tuple[FallbackStrategy, ...] = (FallbackStrategy.NAMED, FallbackStrategy.SINGLE)


class ConfigSelectionError(ConfigError):
    """No config can be chosen for the node (the message says why and what exists)."""


@dataclass(frozen=True)
class Selection:
    """The chosen config: `name` in the config directory, or None for the empty config."""

    name: str | None
    reason: str  # for the log line: "label", "default", or the fallback strategy that chose it


def parse_fallback_strategies(text: str) -> tuple[FallbackStrategy, ...]:
    """`named,single` -> the strategies in order; an unknown or repeated name is an error."""
    strategies: list[FallbackStrategy] = []
    for raw in text.split(","):
        word = raw.strip()
        if not word:
            continue
        try:
            strategy = FallbackStrategy(word)
        except ValueError:
            allowed = ", ".join(s.value for s in FallbackStrategy)
            raise ConfigSelectionError(
                f"FALLBACK_STRATEGIES: unknown strategy {word!r} in {text!r} (allowed: {allowed})"
            ) from None
        if strategy in strategies:
            raise ConfigSelectionError(f"FALLBACK_STRATEGIES: {word!r} is listed twice in {text!r}")
        strategies.append(strategy)
    return tuple(strategies)


def available_config_names(directory: Path) -> list[str]:
    """The config names in a (ConfigMap-mounted) directory: its files, without kubelet's `..data` entries."""
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        raise ConfigSelectionError(f"config directory {directory} does not exist") from None
    except NotADirectoryError:
        raise ConfigSelectionError(f"config directory {directory} is not a directory") from None
    except OSError as exc:  # not searchable (EACCES), a symlink loop: a config error, never an OSError
        raise ConfigSelectionError(f"{directory}: cannot list the configs: {exc.strerror or exc}") from None
    # A mounted ConfigMap holds one symlink per key plus hidden `..data` / `..<timestamp>` entries.
    return sorted(e.name for e in entries if not e.name.startswith(".") and e.is_file())


def _listing(names: Sequence[str]) -> str:
    return ", ".join(names) if names else "none"


def select_config(
    label_value: str,
    available_names: Iterable[str],
    default: str,
    strategies: Sequence[FallbackStrategy],
    label: str = "nvidia.com/device-plugin.config",
) -> Selection:
    names = sorted(set(available_names))
    if label_value:
        if label_value not in names:
            raise ConfigSelectionError(
                f"node label {label}={label_value} names no config (available: {_listing(names)})"
            )
        return Selection(label_value, "label")
    if default:
        if default not in names:
            raise ConfigSelectionError(
                f"DEFAULT_CONFIG={default} names no config (available: {_listing(names)}); "
                f"the node has no {label} label"
            )
        return Selection(default, "default")
    for strategy in strategies:
        if strategy is FallbackStrategy.NAMED and NAMED_DEFAULT_CONFIG in names:
            return Selection(NAMED_DEFAULT_CONFIG, "fallback named")
        if strategy is FallbackStrategy.SINGLE and len(names) == 1:
            return Selection(names[0], "fallback single")
        if strategy is FallbackStrategy.EMPTY:
            return Selection(None, "fallback empty")
    tried = ",".join(s.value for s in strategies) or "none"
    raise ConfigSelectionError(
        f"no config chosen: the node has no {label} label, DEFAULT_CONFIG is not set, and the fallback "
        f"strategies ({tried}) found nothing (available: {_listing(names)})"
    )

"""Where the config file comes from: one file, a directory of named configs, or nowhere (all defaults).

A directory source is a ConfigMap with several keys mounted whole (one file per key, kubelet's `..data`
symlink layout): the file called `name` is used when it exists, else the one called `default_name`. With
neither given, NVIDIA's fallback strategies choose (`named`: the key `default`; `single`: the only key;
`empty`: no file, the built-in defaults; tried in order, `named,single` unless configured). The choice is
made again at every `resolve()`, so a config that appears later (or disappears) is picked up on the next
reload.

Every failure to find or read the file is a ConfigError (an unreadable directory too), so the daemon's reload
rejects it like a bad config instead of dying on an OSError.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.loader import Override, build_config, read_config_document
from nvidia_device_plugin.config.selection import (
    DEFAULT_FALLBACK_STRATEGIES,
    FallbackStrategy,
    available_config_names,
    select_config,
)
from nvidia_device_plugin.config.v1 import Config, ConfigChoice, ConfigOrigin

log = logging.getLogger(__name__)

NO_FILE_SOURCE = "<no config file>"
_FALLBACK_CHOICES: dict[str, ConfigChoice] = {
    FallbackStrategy.NAMED.value: "fallback-named",
    FallbackStrategy.SINGLE.value: "fallback-single",
    FallbackStrategy.EMPTY.value: "fallback-empty",
}


@dataclass(frozen=True)
class ConfigSource:
    """Where the config comes from: a file, or a named file in a directory (config-manager's)."""

    file: Path | None = None
    directory: Path | None = None
    name: str | None = None  # file name inside `directory`
    default_name: str | None = None  # file name inside `directory` when `name` is unset or missing
    # How to choose when neither name nor default_name is given (NVIDIA's config.fallbackStrategies).
    fallback_strategies: tuple[FallbackStrategy, ...] = DEFAULT_FALLBACK_STRATEGIES
    # How the file was named, for the log: "--config-file" or "CONFIG_FILE" (config.flags sets it).
    named_by: str = field(default="", compare=False)
    # The node label whose config `file` links to: the in-process config-manager's link (`linked_by_label`).
    chosen_by_label: str | None = None

    def __post_init__(self) -> None:
        if self.file is not None and self.directory is not None:
            raise ConfigError(
                f"give a config file ({self.file}) or a config directory ({self.directory}), not both"
            )
        if self.directory is None and (self.name or self.default_name):
            raise ConfigError("a config name or default name needs a config directory to look in")
        for label, value in (("config name", self.name), ("default config name", self.default_name)):
            # kubelet's own entries (..data, ..2026_...) start with "..": never a config key.
            if value and ("/" in value or value.startswith("..") or value == "."):
                raise ConfigError(f"{label} {value!r} must be a plain file name inside {self.directory}")

    @classmethod
    def from_file(cls, path: Path, named_by: str = "") -> ConfigSource:
        return cls(file=path, named_by=named_by)

    @classmethod
    def linked_by_label(cls, link: Path, label: str) -> ConfigSource:
        """The in-process config-manager's `link`, pointed at the config the node's `label` chooses (or a
        file of the built-in defaults); its configs' origin names the file the label chose."""
        return cls(file=link, chosen_by_label=label)

    @classmethod
    def from_directory(
        cls,
        directory: Path,
        name: str | None = None,
        default_name: str | None = None,
        fallback_strategies: tuple[FallbackStrategy, ...] = DEFAULT_FALLBACK_STRATEGIES,
    ) -> ConfigSource:
        return cls(
            directory=directory,
            name=name or None,
            default_name=default_name or None,
            fallback_strategies=fallback_strategies,
        )

    def describe(self) -> str:
        if self.file is not None:
            return f"config file {self.file}"
        if self.directory is not None:
            choices = " or ".join(repr(n) for n in (self.name, self.default_name) if n)
            if not choices:
                strategies = ",".join(s.value for s in self.fallback_strategies) or "none"
                return f"the config in {self.directory} chosen by fallback strategies {strategies}"
            return f"config {choices} in {self.directory}"
        return "no config file (defaults)"

    def resolve(self) -> Path | None:
        """The file to read now; None when there is no file to read (all defaults)."""
        return self.choose()[0]

    def choose(self) -> tuple[Path | None, ConfigOrigin]:
        """The file to read now (None: the built-in defaults) and how it was chosen, for the log lines and
        the active-config metric. Raises ConfigError when no file can be chosen."""
        if self.file is not None and self.chosen_by_label is not None:
            return self.file, _chosen_by_label(self.file, self.chosen_by_label)
        if self.file is not None:
            return self.file, ConfigOrigin(str(self.file), "config-file", self._file_why(self.file))
        if self.directory is None:
            return None, ConfigOrigin("", "defaults", "no config file given: built-in defaults")
        if not (self.name or self.default_name):
            return self._fallback(self.directory)
        named: tuple[tuple[ConfigChoice, str, str | None], ...] = (
            ("config-name", "--config-name", self.name),
            ("config-default", "--config-default", self.default_name),
        )
        for choice, flag, name in named:
            candidate = self.directory / name if name else None
            if candidate is not None and _exists(candidate):  # reading it says what is wrong with it
                why = f"{flag} {name!r} in {self.directory}"
                if choice == "config-default" and self.name:
                    why += f" (the --config-name {self.name!r} does not exist there)"
                return candidate, ConfigOrigin(str(candidate), choice, why)
        candidates = [self.directory / n for n in (self.name, self.default_name) if n]
        if len(candidates) == 1:
            raise ConfigError(f"{candidates[0]}: config file not found")
        raise ConfigError(
            f"no config to load: neither {candidates[0]} (the node's config) nor {candidates[1]} "
            "(the default) exists"
        )

    def _file_why(self, file: Path) -> str:
        why = f"{self.named_by or 'config file'} {file}"
        target = _link_target(file)
        # NVIDIA's config-manager (and our --node-config-label) links the chosen ConfigMap key here.
        return why + (f", a link to {target}" if target is not None else "")

    def _fallback(self, directory: Path) -> tuple[Path | None, ConfigOrigin]:
        """NVIDIA's fallback strategies, for a directory source given no name and no default."""
        if not _exists(directory):
            raise ConfigError(f"config directory {directory} does not exist")
        names = available_config_names(directory)
        try:
            selection = select_config("", names, "", self.fallback_strategies)
        except ConfigError:
            tried = ",".join(s.value for s in self.fallback_strategies) or "none"
            raise ConfigError(
                f"config directory {directory}: no --config-name or --config-default given, and the "
                f"fallback strategies ({tried}) chose none of its configs ({', '.join(names) or 'none'}); "
                "name one, or add `empty` to fall back to the built-in defaults"
            ) from None
        strategy = selection.reason.removeprefix("fallback ")
        chosen = repr(selection.name) if selection.name else "the built-in defaults"
        why = (
            f"no --config-name or --config-default: fallback strategy {strategy} chose {chosen} among "
            f"{', '.join(names) or 'no configs'} in {directory}"
        )
        path = None if selection.name is None else directory / selection.name
        return path, ConfigOrigin(str(path or ""), _FALLBACK_CHOICES[strategy], why)

    def load(self, overrides: Mapping[str, Override] | None = None, *, strict: bool = True) -> Config:
        """The config this source names now, with flag/environment `overrides` applied before validation.

        Unknown keys are errors when `strict`, else `Config.warnings` (the daemon's way: see config.loader).
        The config's `origin` says which file was read and why.
        """
        path, origin = self.choose()
        log.debug("config: %s", origin.why)
        if path is None:
            config = build_config(None, overrides or {}, NO_FILE_SOURCE, strict=strict)
        else:
            config = build_config(read_config_document(path), overrides or {}, str(path), strict=strict)
        return replace(config, origin=origin)

    def watch_paths(self) -> list[Path]:
        """The directories whose entries decide this source's content (watch these, not the files).

        kubelet updates a mounted ConfigMap by swapping the `..data` symlink in the mount directory; the file
        path itself never changes, so a watch on the file would miss the update.
        """
        if self.file is not None:
            # A link into a mounted ConfigMap (the node-label follower's, or config-manager's) changes
            # when kubelet swaps `..data` in the link's target directory: watch that one too.
            target = _link_target(self.file)
            if target is not None and target.parent != self.file.parent:
                return [self.file.parent, target.parent]
            return [self.file.parent]
        if self.directory is not None:
            return [self.directory]
        return []


def _chosen_by_label(link: Path, label: str) -> ConfigOrigin:
    """The origin of a config read through the config-manager's `link`: the file `label` chose."""
    try:
        target = os.readlink(link)
    except OSError:  # no link: the config-manager wrote the empty config (fallback empty)
        target = ""
    why = f"node label {label}: {target or 'the built-in defaults'} (config-manager's log line says why)"
    return ConfigOrigin(target, "node-label", why)


def _exists(path: Path) -> bool:
    """Whether `path` names something (a dangling symlink does not); ConfigError when that cannot be known."""
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:  # e.g. the ConfigMap directory is not searchable (EACCES), a symlink loop
        raise ConfigError(f"{path}: cannot look for the config file: {exc.strerror or exc}") from None
    return True


def _link_target(path: Path) -> Path | None:
    """Where the symlink `path` points (one level, absolute), or None when it is no symlink."""
    try:
        target = Path(os.readlink(path))
    except OSError:
        return None
    return target if target.is_absolute() else path.parent / target

"""Where the config file comes from: one file, a directory of named configs, or nowhere (all defaults).

A directory source is a ConfigMap with several keys mounted whole (one file per key, kubelet's `..data`
symlink layout): the file called `name` is used when it exists, else the one called `default_name`. The
choice is made again at every `resolve()`, so a config that appears later (or disappears) is picked up on the
next reload.

Every failure to find or read the file is a ConfigError (an unreadable directory too), so the daemon's reload
rejects it like a bad config instead of dying on an OSError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.config.loader import Override, build_config, read_config_document
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.errors import ConfigError

NO_FILE_SOURCE = "<no config file>"


@dataclass(frozen=True)
class ConfigSource:
    file: Path | None = None
    directory: Path | None = None
    name: str | None = None  # file name inside `directory`
    default_name: str | None = None  # file name inside `directory` when `name` is unset or missing

    def __post_init__(self) -> None:
        if self.file is not None and self.directory is not None:
            raise ConfigError(
                f"give a config file ({self.file}) or a config directory ({self.directory}), not both"
            )
        if self.directory is None and (self.name or self.default_name):
            raise ConfigError("a config name or default name needs a config directory to look in")
        if self.directory is not None and not (self.name or self.default_name):
            raise ConfigError(
                f"config directory {self.directory} needs a config name (--config-name) or a default "
                "(--config-default) to choose a file"
            )
        for label, value in (("config name", self.name), ("default config name", self.default_name)):
            # kubelet's own entries (..data, ..2026_...) start with "..": never a config key.
            if value and ("/" in value or value.startswith("..") or value == "."):
                raise ConfigError(f"{label} {value!r} must be a plain file name inside {self.directory}")

    @classmethod
    def from_file(cls, path: Path) -> ConfigSource:
        return cls(file=path)

    @classmethod
    def from_directory(
        cls, directory: Path, name: str | None = None, default_name: str | None = None
    ) -> ConfigSource:
        return cls(directory=directory, name=name or None, default_name=default_name or None)

    def describe(self) -> str:
        if self.file is not None:
            return f"config file {self.file}"
        if self.directory is not None:
            choices = " or ".join(repr(n) for n in (self.name, self.default_name) if n)
            return f"config {choices} in {self.directory}"
        return "no config file (defaults)"

    def resolve(self) -> Path | None:
        """The file to read now; None when there is no file to read (all defaults)."""
        if self.file is not None:
            return self.file
        if self.directory is None:
            return None
        candidates = [self.directory / n for n in (self.name, self.default_name) if n]
        for candidate in candidates:
            if _exists(candidate):
                return candidate  # reading it says what is wrong if it is not a regular file
        if len(candidates) == 1:
            raise ConfigError(f"{candidates[0]}: config file not found")
        raise ConfigError(
            f"no config to load: neither {candidates[0]} (the node's config) nor {candidates[1]} "
            "(the default) exists"
        )

    def load(self, overrides: Mapping[str, Override] | None = None, *, strict: bool = True) -> Config:
        """The config this source names now, with flag/environment `overrides` applied before validation.

        Unknown keys are errors when `strict`, else `Config.warnings` (the daemon's way: see config.loader).
        """
        path = self.resolve()
        if path is None:
            return build_config(None, overrides or {}, NO_FILE_SOURCE, strict=strict)
        return build_config(read_config_document(path), overrides or {}, str(path), strict=strict)

    def watch_paths(self) -> list[Path]:
        """The directories whose entries decide this source's content (watch these, not the files).

        kubelet updates a mounted ConfigMap by swapping the `..data` symlink in the mount directory; the file
        path itself never changes, so a watch on the file would miss the update.
        """
        if self.file is not None:
            return [self.file.parent]
        if self.directory is not None:
            return [self.directory]
        return []


def _exists(path: Path) -> bool:
    """Whether `path` names something (a dangling symlink does not); ConfigError when that cannot be known."""
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:  # e.g. the ConfigMap directory is not searchable (EACCES), a symlink loop
        raise ConfigError(f"{path}: cannot look for the config file: {exc.strerror or exc}") from None
    return True

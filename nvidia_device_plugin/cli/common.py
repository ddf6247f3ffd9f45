"""What the commands share: environment defaults, the flags of every NVML-reading command, the config loader.

Modules here keep their module-level imports light (argparse and the flag definitions): `main` imports
every command module to build the parser, and each command imports what it runs only when it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from nvidia_device_plugin.config.flags import add_config_arguments, resolve_config
from nvidia_device_plugin.logs import LOG_FORMATS, LOG_LEVELS

if TYPE_CHECKING:
    from nvidia_device_plugin.config.v1 import Config

Command = Callable[[argparse.Namespace, Mapping[str, str]], int]


class AddParser(Protocol):
    """The subparsers' `add_parser` (argparse's own type for it is private)."""

    def __call__(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def env_value(environ: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """An environment variable's value; set to the empty string counts as unset, as NVIDIA's flags read it."""
    value = environ.get(name)
    return value if value not in (None, "") else default


def add_common_arguments(
    sub: argparse.ArgumentParser, environ: Mapping[str, str], simulate_default: str | None = None
) -> None:
    """--simulate, --log-level, --log-format and the config flags, shared by every NVML-reading command."""
    sub.add_argument(
        "--simulate",
        metavar="NODE",
        default=env_value(environ, "NVDP_SIMULATE", simulate_default),
        help="use a simulated node (preset name or YAML node file) instead of NVML [env NVDP_SIMULATE]",
    )
    sub.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=env_value(environ, "NVDP_LOG_LEVEL", "info"),
        help="[env NVDP_LOG_LEVEL]",
    )
    sub.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=env_value(environ, "NVDP_LOG_FORMAT", "text"),
        help="text for people, json for log pipelines [env NVDP_LOG_FORMAT]",
    )
    add_config_arguments(sub)


def config_loader(args: argparse.Namespace, environ: Mapping[str, str]) -> Callable[[], Config]:
    """Resolves file + env + flags afresh on each call (a reload reads the file again)."""
    return lambda: resolve_config(args, environ)

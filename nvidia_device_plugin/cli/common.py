"""What the commands share: environment defaults, the flags of every NVML-reading command, the config loader.

Modules here keep their module-level imports light (argparse and the flag definitions): `main` imports
every command module to build the parser, and each command imports what it runs only when it runs.
"""

from __future__ import annotations

import argparse
import copy
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from nvidia_device_plugin.base.logs import LOG_FORMATS, LOG_LEVELS
from nvidia_device_plugin.config.flags import (
    add_config_arguments,
    add_config_option_arguments,
    resolve_config,
    states_default,
)

if TYPE_CHECKING:
    from nvidia_device_plugin.config.v1 import Config

__all__ = [
    "AddParser",
    "Command",
    "DefaultsHelpFormatter",
    "add_common_arguments",
    "add_config_option_arguments",
    "config_loader",
    "env_value",
    "preset_names",
    "simulate_help",
]

Command = Callable[[argparse.Namespace, Mapping[str, str]], int]
# The simulator's presets, listed here without importing the simulator or importlib.resources (--help stays
# light); the same list as nvml.sim.node.preset_names (tests/cli/test_cli_help.py).
_PRESETS_DIR = Path(__file__).resolve().parent.parent / "nvml" / "sim" / "presets"


class AddParser(Protocol):
    """The subparsers' `add_parser` (argparse's own type for it is private)."""

    def __call__(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help that shows every option's default: "(default: X)" after the text, unless the text says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not action.option_strings or action.default is argparse.SUPPRESS or states_default(text):
            return text
        if action.nargs == 0:  # a switch: off unless given
            return f"{text} (default: {'on' if action.default else 'off'})".strip()
        shown = (
            "%(default)s"
            if action.default not in (None, "")
            else ("none" if action.default is None else "''")
        )
        return f"{text} (default: {shown})".strip()

    def _split_lines(self, text: str, width: int) -> list[str]:
        # Never break a preset or flag name at its hyphen ("a100-mig-\nmixed").
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            " ".join(text.split()),
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
        )

    def _format_action(self, action: argparse.Action) -> str:
        if action.option_strings and not action.help and action.default is not argparse.SUPPRESS:
            action = copy.copy(action)  # an option without help text still shows its default
            action.help = "(default: %(default)s)"
        return super()._format_action(action)


def preset_names() -> list[str]:
    return sorted(path.stem for path in _PRESETS_DIR.glob("*.json"))


def simulate_help() -> str:
    return f"a preset ({', '.join(preset_names())}) or a YAML node file"


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
        help=f"use a simulated node instead of NVML: {simulate_help()} [env NVDP_SIMULATE]",
    )
    sub.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=env_value(environ, "NVDP_LOG_LEVEL", "info"),
        help="debug adds discovery and selection decisions [env NVDP_LOG_LEVEL]",
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


def seconds_up_to(most: float) -> Callable[[str], float]:
    """An argparse type: a number of seconds in (0, most]; anything else is refused naming the range."""

    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 < value <= most:
            raise argparse.ArgumentTypeError(f"must be a number of seconds in (0, {most:g}], got {text!r}")
        return value

    return seconds

"""`nvidia-device-plugin`: builds the parser from the command modules and runs the command chosen.

Commands: run (the default), mps-control-daemon, demo, plan, check-config, labels; each lives in its own
module with an `add_parser` that declares its flags and its handler. Precedence: flag > env > config file
> default. `config-manager` and `gpu-feature-discovery` are programs of their own (config_manager.py,
gfd.py), with the command lines NVIDIA's images have.

Without a command, `run` is meant (NVIDIA's plugin has no commands): the command is the first word that is
no option and no option's value, so `--config-name plan` is a config called plan, never the command.
A word that is no command gets a "did you mean" (`plna`), and so does a command after options
(`--simulate dgx-a100 plan`: options go after the command), and an option no command knows.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NoReturn

from nvidia_device_plugin import __version__
from nvidia_device_plugin.base.errors import DevicePluginError
from nvidia_device_plugin.base.logs import configure_logging
from nvidia_device_plugin.cli.common import AddParser, Command, DefaultsHelpFormatter, preset_names
from nvidia_device_plugin.cli.run import DEFAULT_PLUGIN_DIR

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = ["COMMANDS", "DEFAULT_PLUGIN_DIR", "build_parser", "main"]

log = logging.getLogger("nvidia_device_plugin")

COMMANDS = ("run", "mps-control-daemon", "demo", "plan", "check-config", "labels", "dra")
_TOP_LEVEL = ("-h", "--help", "--version")


class _Parser(argparse.ArgumentParser):
    """argparse, with a "did you mean" for a misspelt option (argparse 3.11 has none)."""

    options: tuple[str, ...] = ()  # every option of every command, set by build_parser

    def error(self, message: str) -> NoReturn:
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            hints = []
            import difflib  # here: only a usage error needs it, not every start of the daemon

            for word in message.removeprefix(prefix).split():
                close = difflib.get_close_matches(word.split("=")[0], self.options, n=1)
                if word.startswith("--") and close:
                    hints.append(f"{word}: did you mean {close[0]}?")
            if hints:
                message += " (" + "; ".join(hints) + ")"
        super().error(message)


def _imported(module: str) -> Callable[[AddParser, Mapping[str, str]], None]:
    """The `add_parser` of `nvidia_device_plugin.cli.<module>`, importing that module only when called."""

    def add_parser(add: AddParser, environ: Mapping[str, str]) -> None:
        command = importlib.import_module(f"nvidia_device_plugin.cli.{module}")
        if module == "check_config":
            command.add_parser(add)
        else:
            command.add_parser(add, environ)

    return add_parser


# Each command's parser, in the order `--help` lists them. A command's module is imported only when its
# parser is built, so `run` starts without loading the other commands (plan's and demo's printers, the
# MPS control daemon, check-config).
_ADD_PARSER: dict[str, Callable[[AddParser, Mapping[str, str]], None]] = {
    "run": _imported("run"),
    "mps-control-daemon": _imported("mps_control"),
    "demo": _imported("demo"),
    "plan": _imported("plan"),
    "labels": _imported("labels"),
    "check-config": _imported("check_config"),
    "dra": _imported("dra"),
}
_HELP_OR_VERSION = frozenset(("-h", "--help", "--version"))


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = _program_parser(_Parser, environ, _ADD_PARSER)
    _Parser.options = tuple(sorted({o for sub in _commands(parser).values() for o in _option_table(sub)}))
    return parser


def _program_parser(
    parser_class: type[_Parser],
    environ: Mapping[str, str],
    commands: Mapping[str, Callable[[AddParser, Mapping[str, str]], None]],
) -> argparse.ArgumentParser:
    parser = parser_class(
        prog="nvidia-device-plugin",
        formatter_class=DefaultsHelpFormatter,
        description="Kubernetes device plugin for NVIDIA GPUs: whole GPUs, time-slicing, MPS and MIG.",
        epilog="Without a command, run is meant. Simulated nodes for --simulate: "
        f"{', '.join(preset_names())}, or a YAML node file. 'nvidia-device-plugin COMMAND --help' lists a "
        "command's flags and their defaults.",
    )
    parser.add_argument("--version", action="version", version=f"nvidia-device-plugin {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    add = functools.partial(subparsers.add_parser, formatter_class=DefaultsHelpFormatter)
    for add_parser in commands.values():
        add_parser(add, environ)
    return parser


class _NotForTheOneCommand(Exception):
    """The command line needs the full parser: help, a usage error, or an exit."""


class _OneCommandParser(_Parser):
    """The parser of the one command named first. It prints nothing and never exits: whatever it would say
    (help, version, a usage error) the full parser says instead, word for word."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        pass

    def error(self, message: str) -> NoReturn:
        raise _NotForTheOneCommand(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _NotForTheOneCommand(message or "")


def parse_command_line(words: Sequence[str], environ: Mapping[str, str]) -> argparse.Namespace:
    """`words` (argv without the program) parsed. When they start with a command, or are empty (run), only
    that command's parser is built: the other six cost every start-up of the daemon about 8 ms of CPU, and
    the program's epilog lists the simulator's presets. Anything else goes through the full parser."""
    name = words[0] if words else "run"
    if name in _ADD_PARSER and not _HELP_OR_VERSION.intersection(words):
        parser = _program_parser(_OneCommandParser, environ, {name: _ADD_PARSER[name]})
        try:
            return parser.parse_args(list(words) or [name])
        except _NotForTheOneCommand:
            pass  # said below by the full parser, as every other usage error is
    parser = build_parser(environ)
    return parser.parse_args(with_command(list(words), parser))


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _option_table(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return dict(parser._option_string_actions)


def with_command(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """`argv` with its command first: `run` put in front when none is given; a usage error (exit 2) for a
    word that is no command, or a command that comes after options."""
    commands = _commands(parser)
    options: dict[str, argparse.Action] = {}
    for sub in reversed(commands.values()):  # run's own meaning wins for an option several commands have
        options.update(_option_table(sub))
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            break
        if token.startswith("-"):
            if token in _TOP_LEVEL and i == 0:
                return list(argv)  # the program's own help or version
            action = options.get(token.split("=", 1)[0])
            if action is not None and "=" not in token and _takes_value(action, argv, i):
                i += 1
            i += 1
            continue
        if token in commands:
            if i == 0:
                return list(argv)
            moved = " ".join([token, *argv[:i], *argv[i + 1 :]])
            parser.error(f"options go after the command: did you mean 'nvidia-device-plugin {moved}'?")
        import difflib  # here: only a usage error needs it, not every start of the daemon

        close = difflib.get_close_matches(token, commands, n=1)
        hint = f"did you mean {close[0]}?" if close else f"the commands are {', '.join(COMMANDS)}"
        parser.error(f"{token!r} is not a command ({hint}); without a command, run is meant")
    return ["run", *argv]


def _takes_value(action: argparse.Action, argv: Sequence[str], i: int) -> bool:
    """Whether the option at argv[i] consumes the next word, as argparse would."""
    if action.nargs == 0:
        return False
    if action.nargs == "?":  # NVIDIA-style booleans: `--pass-device-specs` alone, or with a value
        return i + 1 < len(argv) and not argv[i + 1].startswith("-")
    return True


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    # gRPC's C core logs transport chatter (GOAWAY on every kubelet restart) to stderr at INFO; it is
    # read when grpc is first imported, which happens below, lazily, after this.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    env = dict(os.environ if environ is None else environ)
    args = parse_command_line(list(sys.argv[1:] if argv is None else argv), env)
    handler: Command = args.handler
    if args.command == "check-config":
        return handler(args, env)  # prints its own verdict: no log configuration, no NVML
    configure_logging(args.log_level, args.log_format)
    try:
        return handler(args, env)
    except DevicePluginError as exc:
        log.error("%s", exc)  # logging goes to stderr: the one line an operator reads in `kubectl logs`
        return 1

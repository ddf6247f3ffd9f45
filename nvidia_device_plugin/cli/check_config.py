"""`check-config`: is each config valid, and (with `--simulate NODE`) what would `run` do with it there.

It takes several inputs at once, so a migration checks every key of its ConfigMaps in one go: config files;
a directory holding one config per file (a ConfigMap mounted whole: kubelet's `..data` entries are
skipped); a ConfigMap manifest (`kubectl get configmap -o yaml`: each key of `data`, or every ConfigMap of a
`kind: List`); `-` for standard input (any of those, bounded like a file). It reads them strictly (unknown
keys are errors, with the "did you mean" hint) and prints every mistake of each, one per line, then what
would be ignored (NVIDIA v0.20's resource naming, unknown to GFD...).

Without `--simulate` it checks what it can without a node (kubelet's ListAndWatch limit for the largest
likely node). With `--simulate NODE` (a preset or a node file) it builds the snapshot `run` would serve on
that node and refuses what `run` refuses there: a device list over kubelet's limit, device references the
node does not have, MPS on MIG, required IMEX channels that are missing, a CDI spec that cannot be made;
it prints the warnings `run` would log and the resources it would advertise. The config flags
(`--mig-strategy`, `--resource-naming`, ...) apply to every input, as on the daemon's command line.

Without `--simulate` it imports neither NVML nor the pipeline (tests/cli/test_import_cost.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from nvidia_device_plugin.base.errors import DevicePluginError
from nvidia_device_plugin.cli.common import AddParser, add_config_option_arguments, simulate_help

if TYPE_CHECKING:
    from nvidia_device_plugin.config.loader import Override
    from nvidia_device_plugin.config.v1 import Config
    from nvidia_device_plugin.nvml.session import NvmlSession

STDIN = "-"


@dataclass(frozen=True)
class _Input:
    """One config to check: where it is (for messages) and its decoded document."""

    name: str
    document: object


def add_parser(commands: AddParser) -> None:
    check = commands(
        "check-config",
        help="validate config files, ConfigMap directories or manifests, or - (stdin); with --simulate, "
        "predict what run does with them on that node",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    check.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="a config file (YAML or JSON, version: v1), a directory of configs (a ConfigMap mounted whole), "
        "a ConfigMap manifest, or - for standard input",
    )
    check.add_argument(
        "--simulate",
        metavar="NODE",
        default=None,
        help="also check each config against this simulated node as run would: "
        + simulate_help()
        + " (default: no node; only what needs none is checked)",
    )
    add_config_option_arguments(check)
    check.set_defaults(handler=check_config)


def check_config(args: argparse.Namespace, _environ: Mapping[str, str]) -> int:
    """Prints its verdicts itself (no log lines); 0 when every config is valid, else 1."""
    from nvidia_device_plugin.config.flags import overrides_from

    _files_after_switches(args)
    overrides = overrides_from(args, {})  # the command line only: the shell's environment is not the pod's
    if not args.files:
        print(
            "check-config: name at least one FILE (a config, a ConfigMap directory or manifest, or -)",
            file=sys.stderr,
        )
        return 2
    session = _open_node(args.simulate)
    if isinstance(session, str):
        print(session, file=sys.stderr)
        return 1
    checked = invalid = 0
    try:
        for item in _inputs(args.files):
            checked += 1
            if isinstance(item, str):  # it could not be read
                print(item, file=sys.stderr)
                invalid += 1
            elif not _check_one(item, overrides, session, args.simulate, sys.stdout, sys.stderr):
                invalid += 1
    finally:
        if session is not None:
            session.close()
    if checked > 1 and invalid:
        print(f"{invalid} of {checked} configs are invalid", file=sys.stderr)
    return 1 if invalid else 0


def _files_after_switches(args: argparse.Namespace) -> None:
    """`check-config --resource-naming a.yaml`: a boolean flag takes an optional value (NVIDIA's style), so
    argparse hands it the file; a value that is no boolean word is a file, and the switch is on."""
    from nvidia_device_plugin.config.flags import parse_bool
    from nvidia_device_plugin.config.options import CONFIG_OPTIONS

    for option in CONFIG_OPTIONS:
        given = getattr(args, option.dest, None)
        if option.kind == "bool" and isinstance(given, str) and parse_bool(given) is None:
            args.files.insert(0, given)
            setattr(args, option.dest, "true")


def _open_node(simulate: str | None) -> NvmlSession | str | None:
    """The simulated node to check against (None: no node); a message when it cannot be opened."""
    if not simulate:
        return None
    from nvidia_device_plugin.cli.session import open_session

    try:
        return open_session(simulate)
    except DevicePluginError as exc:
        return f"--simulate {simulate}: {exc}"


def _inputs(names: list[str]) -> Iterator[_Input | str]:
    """Each config named on the command line, decoded; a message instead for one that cannot be read."""
    from nvidia_device_plugin.base.errors import ConfigError
    from nvidia_device_plugin.config.document import read_config_document, read_config_stream
    from nvidia_device_plugin.config.selection import available_config_names

    for name in names:
        try:
            if name == STDIN:
                yield from _configmaps(_Input("<stdin>", read_config_stream(sys.stdin.buffer, "<stdin>")))
            elif Path(name).is_dir():
                entries = available_config_names(Path(name))
                if not entries:
                    yield f"{name}: a directory with no config files in it"
                for entry in entries:
                    path = Path(name) / entry
                    try:
                        yield _Input(str(path), read_config_document(path))
                    except ConfigError as exc:
                        yield str(exc)
            else:
                yield from _configmaps(_Input(name, read_config_document(name)))
        except ConfigError as exc:
            yield str(exc)


def _configmaps(item: _Input) -> Iterator[_Input | str]:
    """The configs in a ConfigMap manifest (each key of `data`; each ConfigMap of a List), else `item`."""
    from nvidia_device_plugin.base.errors import ConfigError
    from nvidia_device_plugin.config.document import parse_document_text

    doc = item.document
    if not isinstance(doc, dict) or doc.get("kind") not in ("ConfigMap", "List"):
        yield item
        return
    maps = doc.get("items") if doc.get("kind") == "List" else [doc]
    for configmap in maps if isinstance(maps, list) else []:
        if not isinstance(configmap, dict) or configmap.get("kind") != "ConfigMap":
            continue
        name = (
            configmap.get("metadata", {}).get("name", "?")
            if isinstance(configmap.get("metadata"), dict)
            else "?"
        )
        data = configmap.get("data")
        for key, text in data.items() if isinstance(data, dict) else ():
            where = f"{item.name}: ConfigMap {name} key {key}"
            if not isinstance(text, str):
                yield f"{where}: the value is not text"
                continue
            try:
                yield _Input(where, parse_document_text(text, where))
            except ConfigError as exc:
                yield str(exc)


def _check_one(
    item: _Input,
    overrides: Mapping[str, Override],
    session: NvmlSession | None,
    node: str | None,
    out: TextIO,
    err: TextIO,
) -> bool:
    """Check one config, print its verdict; True when valid."""
    from nvidia_device_plugin.config.loader import ConfigProblems, build_config, gfd_incompatibilities

    try:
        config = build_config(item.document, overrides, item.name)  # strict: unknown keys are errors
    except ConfigProblems as exc:
        for line in exc.lines:
            print(line, file=err)
        return False
    except DevicePluginError as exc:
        print(f"{exc}", file=err)
        return False
    for warning in config.warnings:
        print(f"warning: {warning.message}", file=err)
    for problem in gfd_incompatibilities(config):
        print(f"warning: {item.name}: {problem}", file=err)
    if session is not None:
        verdict = _against_node(item.name, config, session, node, err)
    else:
        verdict = _nodeless(config, err)
    if verdict is None:
        return False
    print(f"{item.name}: valid{verdict}", file=out)
    return True


def _nodeless(config: Config, err: TextIO) -> str | None:
    from nvidia_device_plugin.plans.device_lists import check_config_device_lists

    try:
        check_config_device_lists(config)
    except DevicePluginError as exc:
        print(f"{exc}", file=err)
        return None
    return ""


def _against_node(
    name: str, config: Config, session: NvmlSession, node: str | None, err: TextIO
) -> str | None:
    """What `run` would do with `config` on the node: None (printed why) when it would refuse it."""
    from nvidia_device_plugin.daemons.announce import notices, resources_line
    from nvidia_device_plugin.serving.imex import imex_problem
    from nvidia_device_plugin.snapshot import build_snapshot

    try:
        snapshot = build_snapshot(session, config)
    except DevicePluginError as exc:
        print(f"{name}: on {node}, run would refuse it: {exc}", file=err)
        return None
    problem = imex_problem(snapshot.allocation)
    if problem is None and snapshot.cdi is not None:
        problem = snapshot.cdi.problem
    if problem is not None:
        print(f"{name}: on {node}, run would serve no resource: {problem}", file=err)
        return None
    for notice in notices(snapshot):
        if not notice.key.startswith("config "):  # the config's own warnings are printed already
            print(f"warning: {name}: on {node}: {notice.message}", file=err)
    return f" on {node}; {resources_line(snapshot)}"

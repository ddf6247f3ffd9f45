"""`plan` (what this node would advertise) and `check-config` (is this config file valid): they read, print
and exit, so they import neither the gRPC servers nor prometheus_client nor the kubernetes client."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping

from nvidia_device_plugin.cli.common import AddParser, add_common_arguments
from nvidia_device_plugin.config.flags import resolve_config
from nvidia_device_plugin.errors import DevicePluginError


def add_parser(commands: AddParser, environ: Mapping[str, str]) -> None:
    plan = commands("plan", help="print the resources and device IDs this node would advertise")
    add_common_arguments(plan, environ)
    plan.add_argument("--output", choices=("table", "json"), default="table")
    plan.add_argument(
        "--cdi-spec",
        action="store_true",
        help="print the CDI specs a cdi-annotations / cdi-cri strategy would write, as JSON by file name",
    )
    plan.set_defaults(handler=print_plan)


def add_check_config_parser(commands: AddParser) -> None:
    check = commands("check-config", help="validate a config file; non-zero exit with the error")
    check.add_argument("file", help="config file (YAML or JSON, version: v1)")
    check.set_defaults(handler=check_config)


def check_config(args: argparse.Namespace, _environ: Mapping[str, str]) -> int:
    """Prints its verdict itself (no log lines): the file, strictly, and nothing of the node."""
    from nvidia_device_plugin.config.loader import gfd_incompatibilities, load_config_file
    from nvidia_device_plugin.device_lists import check_config_device_lists

    path: str = args.file
    try:
        config = load_config_file(path)  # strict: unknown keys are errors here, warnings in the daemon
        check_config_device_lists(config)
    except DevicePluginError as exc:
        print(f"{exc}", file=sys.stderr)
        return 1
    for warning in config.warnings:
        print(f"warning: {warning.message}", file=sys.stderr)
    for problem in gfd_incompatibilities(config):
        print(f"warning: {path}: {problem}", file=sys.stderr)
    print(f"{path}: valid")
    return 0


def print_plan(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from nvidia_device_plugin.cdi.view import cdi_to_json, render_cdi_summary
    from nvidia_device_plugin.cli.planview import plan_to_json, render_plan_table
    from nvidia_device_plugin.cli.session import open_session
    from nvidia_device_plugin.snapshot import build_snapshot

    config = resolve_config(args, environ)
    session = open_session(args.simulate)
    try:
        snapshot = build_snapshot(session, config)
    finally:
        session.close()
    cdi = snapshot.cdi
    if args.cdi_spec:
        if cdi is None or cdi.problem is not None:
            print(cdi.problem if cdi else "no CDI device-list strategy is configured", file=sys.stderr)
            return 1
        print(json.dumps({s.file_name: s.document for s in cdi.specs}, indent=2))
    elif args.output == "json":
        document = plan_to_json(snapshot.plans, snapshot.inventory)
        print(json.dumps({**document, "cdi": cdi_to_json(cdi)}, indent=2))
    else:
        print(render_plan_table(snapshot.plans, snapshot.inventory) + render_cdi_summary(cdi), end="\n")
    if config.dra.enabled and not args.cdi_spec:
        from nvidia_device_plugin.cli.dra import dra_summary

        print(dra_summary(snapshot), file=sys.stderr if args.output == "json" else sys.stdout)
    return 0

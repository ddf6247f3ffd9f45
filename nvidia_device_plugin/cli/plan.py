"""`plan`: what this node would advertise, and every warning `run` would log about it. It reads, prints and
exits, so it imports neither the gRPC servers nor prometheus_client nor the kubernetes client."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping

from nvidia_device_plugin.cli.common import AddParser, add_common_arguments
from nvidia_device_plugin.config.flags import resolve_config


def add_parser(commands: AddParser, environ: Mapping[str, str]) -> None:
    plan = commands(
        "plan",
        help="print the resources and device IDs this node would advertise, and every warning run would log",
    )
    add_common_arguments(plan, environ)
    plan.add_argument(
        "--output",
        choices=("table", "json"),
        default="table",
        help="table for people; json for programs (keys: cli/planview.py), warnings included",
    )
    plan.add_argument(
        "--cdi-spec",
        action="store_true",
        help="print the CDI specs a cdi-annotations / cdi-cri strategy would write, as JSON by file name",
    )
    plan.set_defaults(handler=print_plan)


def print_plan(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """The plan on stdout; every warning `run` would log on stderr ("warning: ..."), before it."""
    from nvidia_device_plugin.cdi.view import cdi_to_json, render_cdi_summary
    from nvidia_device_plugin.cli.planview import plan_to_json, render_plan_table
    from nvidia_device_plugin.cli.session import open_session
    from nvidia_device_plugin.daemons.announce import nothing_served_reason, notices
    from nvidia_device_plugin.serving.imex import imex_problem
    from nvidia_device_plugin.snapshot import build_snapshot

    config = resolve_config(args, environ)
    session = open_session(args.simulate)
    try:
        snapshot = build_snapshot(session, config)
    finally:
        session.close()
    refused = imex_problem(snapshot.allocation)
    if refused is not None:  # the daemon refuses to serve it (daemon._servable)
        print(f"run would refuse this config: {refused}", file=sys.stderr)
        return 1
    warnings = [notice.message for notice in notices(snapshot)]
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    empty = None if snapshot.plans else nothing_served_reason(snapshot)
    cdi = snapshot.cdi
    if args.cdi_spec:
        if cdi is None or cdi.problem is not None:
            print(cdi.problem if cdi else "no CDI device-list strategy is configured", file=sys.stderr)
            return 1
        print(json.dumps({s.file_name: s.document for s in cdi.specs}, indent=2))
    elif args.output == "json":
        document = plan_to_json(snapshot.plans, snapshot.inventory)
        extra = {"warnings": warnings, "nothing_advertised": empty, "cdi": cdi_to_json(cdi)}
        print(json.dumps({**document, **extra}, indent=2))
    else:
        table = render_plan_table(snapshot.plans, snapshot.inventory, empty or "")
        print(table + render_cdi_summary(cdi), end="\n")
    if config.dra.enabled and not args.cdi_spec:
        from nvidia_device_plugin.cli.dra import dra_summary

        print(dra_summary(snapshot), file=sys.stderr if args.output == "json" else sys.stdout)
    return 0

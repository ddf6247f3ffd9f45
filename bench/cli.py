"""`python -m bench [--quick] [--only a,b] [--idle-seconds S] [--iterations N] [--output-dir DIR]`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.figures import Figure, render_table
from bench.procs import BENCH_DIR
from bench.sampling import FULL, QUICK, Budget
from bench.scenarios import SCENARIOS

IDLE_SECONDS_ENV = "NVDP_BENCH_IDLE_SECONDS"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark the device plugin as a separate process against a kubelet stand-in; "
        "every figure is reported beside a reference measured in the same run.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="few iterations and a short idle window (a smoke run)"
    )
    parser.add_argument(
        "--only",
        metavar="A,B",
        help=f"run only these scenarios, comma-separated, of: {', '.join(SCENARIOS)}",
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=None,
        help=f"idle-CPU window in seconds (default 30, or 3 with --quick) [env {IDLE_SECONDS_ENV}]",
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=None,
        metavar="N",
        help="cap every sample count at N (for smoke tests)",
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=BENCH_DIR,
        help="where results.json and results.txt are written (default: bench/)",
    )
    return parser


def budget_from(args: argparse.Namespace, environ: dict[str, str]) -> Budget:
    budget = QUICK if args.quick else FULL
    if args.iterations is not None:
        budget = budget.capped(args.iterations)
    idle = args.idle_seconds
    if idle is None and environ.get(IDLE_SECONDS_ENV):
        idle = float(environ[IDLE_SECONDS_ENV])
    if idle is not None:
        if idle <= 0:
            raise SystemExit(f"idle window must be > 0 seconds, got {idle:g}")
        budget = replace(budget, idle_seconds=idle)
    return budget


def selected(only: str | None) -> list[str]:
    if not only:
        return list(SCENARIOS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario {unknown[0]!r}; known: {', '.join(SCENARIOS)}")
    return names


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # In-process scenarios run a Daemon here: its expected warnings (a GPU made unhealthy) are not results.
    logging.basicConfig(level=logging.ERROR, format="bench: %(levelname)s %(name)s: %(message)s")
    budget = budget_from(args, dict(os.environ))
    names = selected(args.only)
    figures: list[Figure] = []
    started = time.perf_counter()
    for name in names:
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        t = time.perf_counter()
        figures.extend(SCENARIOS[name](budget))
        print(f"bench: {name} done in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    info = machine()
    header = (
        f"nvidia-device-plugin benchmarks ({'quick' if args.quick else 'full'} run, {elapsed:.0f} s) on "
        f"{info['cpus_usable']} CPUs ({info['cpu_model'] or 'unknown CPU'}), Python {info['python']}\n\n"
    )
    table = header + render_table(figures)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    document = {
        "mode": "quick" if args.quick else "full",
        "scenarios": names,
        "budget": asdict(budget),
        "seconds": elapsed,
        "machine": info,
        "figures": [f.to_json() for f in figures],
    }
    (args.output_dir / "results.json").write_text(json.dumps(document, indent=2) + "\n")
    (args.output_dir / "results.txt").write_text(table)
    print(table, end="")
    return 0

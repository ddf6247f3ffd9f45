"""The flags of `mps-control-daemon` beyond those it shares with `run` (kept light: cli.py imports it)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

CONTROL_EXECUTABLE = "nvidia-cuda-mps-control"


def add_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    parser.add_argument(
        "--mps-control-binary",
        default=environ.get("NVDP_MPS_CONTROL_BINARY") or CONTROL_EXECUTABLE,
        metavar="PATH",
        help=f"the MPS control program (default {CONTROL_EXECUTABLE}, looked up on PATH); a missing one "
        "is reported per GPU and leaves its replicas not ready [env NVDP_MPS_CONTROL_BINARY]",
    )

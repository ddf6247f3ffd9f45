"""The benchmark harness works: `python -m bench` in a tiny mode runs, and writes the table and the JSON.

No timing is asserted; speed is what `make bench` reports, not what tests check.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.waiting import scaled

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_bench(output_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", "--output-dir", str(output_dir), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )


def test_tiny_run_writes_results_with_references(tmp_path: Path) -> None:
    args = ("--quick", "--only", "allocate,idle", "--iterations", "2", "--idle-seconds", "0.5")
    done = run_bench(tmp_path, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    figures = {f["key"]: f for f in results["figures"]}
    assert results["scenarios"] == ["allocate", "idle"]
    assert set(figures) == {
        *(f"allocate.{kind}.{n}" for kind in ("whole", "replicas") for n in (1, 2, 8)),
        "idle_cpu.800",
    }

    allocate = figures["allocate.replicas.8"]
    assert allocate["value"]["samples"] == 2 and allocate["value"]["median"] > 0
    assert allocate["reference"]["title"] == "bare grpcio Allocate"
    assert allocate["reference"]["value"]["median"] > 0
    assert allocate["ratio"]["median"] > 0
    assert allocate["target"]["text"] == "p99 < 3x reference" and isinstance(allocate["target"]["met"], bool)

    idle = figures["idle_cpu.800"]
    assert idle["title"] == "Idle CPU over 0.5 s, 800 devices"  # the window is the flag's
    assert idle["value"]["p99"] is None and idle["value"]["median"] >= 0
    assert idle["reference"]["title"] == "idle grpcio server"
    assert idle["target"]["text"] == "value < 0.5 %"

    table = (tmp_path / "results.txt").read_text()
    assert table == done.stdout
    assert "Allocate 8 of 800 time-sliced replicas (ms)" in table
    assert "Idle CPU over 0.5 s, 800 devices (% of a core)" in table


def test_unknown_scenario_is_refused(tmp_path: Path) -> None:
    done = run_bench(tmp_path, "--only", "allocate,warp-drive")
    assert done.returncode != 0
    assert "unknown scenario 'warp-drive'" in done.stderr
    assert not (tmp_path / "results.json").exists()

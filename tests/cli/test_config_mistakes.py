"""Mistakes in a config are reported alike by check-config, plan and run: every one, with its hint; and `plan`
prints every warning `run` would log, and why nothing is advertised when nothing is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nvidia_device_plugin.cli.main import main

from support.waiting import scaled

TYPO = """version: v1
flags: {plugin: {passDeviceSpec: true}}
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replica: 4
"""
MISTAKES = [
    "flags.plugin.passDeviceSpec: unknown field (did you mean passDeviceSpecs?)",
    "sharing.timeSlicing.resources[0].replica: unknown field (did you mean replicas?)",
    "sharing.timeSlicing.resources[0].replicas: required field is missing",
]


@pytest.fixture
def typo(tmp_path: Path) -> Path:
    path = tmp_path / "typo.yaml"
    path.write_text(TYPO)
    return path


def test_check_config_reports_every_mistake_with_its_hint(
    typo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", str(typo)], {}) == 1
    assert capsys.readouterr().err.splitlines() == [f"{typo}: {m}" for m in MISTAKES]


def test_plan_reports_every_mistake_with_its_hint(typo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--simulate", "t4-single", "--config-file", str(typo)], {}) == 1
    assert f"ERROR   nvidia_device_plugin: {typo}: " + "; ".join(MISTAKES) in capsys.readouterr().err


def test_run_reports_every_mistake_with_its_hint(typo: Path, tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvidia_device_plugin",
            "run",
            "--simulate",
            "t4-single",
            "--config-file",
            str(typo),
            "--device-plugin-path",
            str(tmp_path),
            "--metrics-address",
            "",
        ],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert run.returncode == 1
    assert f"{typo}: " + "; ".join(MISTAKES) in run.stderr


def test_plan_prints_the_warnings_run_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "version: v1\nflags: {migStrategy: single, plugin: {passDeviceSpec: true}}\n"
        "resources: {gpus: [{pattern: '*', name: any}]}\n"
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/mig-1g.10gb, replicas: 2}]}}\n"
    )
    assert main(["plan", "--simulate", "h100-nvl", "--config-file", str(path), "--output", "json"], {}) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    warnings = [
        line.removeprefix("warning: ") for line in captured.err.splitlines() if line.startswith("warning: ")
    ]
    assert warnings == document["warnings"]
    unknown = "flags.plugin.passDeviceSpec: unknown field (did you mean passDeviceSpecs?); ignored"
    assert warnings[0] == f"config: {path}: {unknown}"
    assert warnings[1].startswith(f"config: {path}: resources.gpus: Customizing the 'resources' field is not")
    assert sorted(w[: len("flags.migStrategy=single: GPU 0")] for w in warnings[2:4]) == [
        "flags.migStrategy=single: GPU 0",  # MIG profiles other than the node's
        "flags.migStrategy=single: GPU 1",  # not in MIG mode
    ]
    assert warnings[4] == (
        "config: sharing.timeSlicing.resources[0] shares nvidia.com/mig-1g.10gb, which no device of this "
        "node is advertised as (this node has no resources); the entry is skipped"
    )
    assert len(warnings) == 5
    assert document["resources"] == []
    assert document["nothing_advertised"].startswith("every GPU breaks flags.migStrategy=single")


def test_plan_says_why_nothing_is_advertised(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "single.yaml"
    path.write_text("version: v1\nflags: {migStrategy: single}\n")
    assert main(["plan", "--simulate", "b200", "--config-file", str(path), "--log-level", "error"], {}) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "No resources to advertise: every GPU breaks flags.migStrategy=single (each is named in a warning); "
        "fix the MIG layout, or use migStrategy: mixed, which advertises each profile as its own resource."
    )

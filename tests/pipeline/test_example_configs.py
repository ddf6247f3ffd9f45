"""Each example config in configs/, on the simulated presets, through the real discovery path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nvidia_device_plugin.config.loader import load_config_file
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.plans.resources import ResourcePlan, physical_uuid_of
from nvidia_device_plugin.snapshot import build_snapshot

from support.checks import assert_all
from support.waiting import scaled

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def plan(config: str, node: str) -> dict[str, ResourcePlan]:
    session = open_nvml(node)
    try:
        snapshot = build_snapshot(session, load_config_file(CONFIGS / config))
    finally:
        session.close()
    return {p.name: p for p in snapshot.plans}


# (config file, preset) -> {resource: (device count, sharing, replicas)}
EXPECTED = {
    ("time-slicing.yaml", "dgx-a100"): {"nvidia.com/gpu": (32, "time-slicing", 4)},
    ("time-slicing-rename.yaml", "dgx-a100"): {"nvidia.com/gpu.shared": (32, "time-slicing", 4)},
    ("mps.yaml", "dgx-h100"): {"nvidia.com/gpu": (32, "mps", 4)},
    ("mig-mixed.yaml", "a100-mig-mixed"): {
        "nvidia.com/gpu": (1, "none", 1),
        "nvidia.com/mig-1g.10gb": (9, "none", 1),
        "nvidia.com/mig-2g.20gb": (1, "none", 1),
        "nvidia.com/mig-3g.40gb": (3, "none", 1),
    },
    ("mig-mixed.yaml", "dgx-a100"): {"nvidia.com/gpu": (8, "none", 1)},
    ("mig-single.yaml", "a100-mig-single"): {"nvidia.com/gpu": (14, "none", 1)},
    ("mig-single.yaml", "t4-single"): {"nvidia.com/gpu": (1, "none", 1)},
    ("per-model-renames.yaml", "mixed-a100-h100"): {
        "nvidia.com/a100": (2, "none", 1),
        "nvidia.com/h100": (2, "none", 1),
    },
    ("per-model-renames.yaml", "a100-mig-mixed"): {
        "nvidia.com/a100": (1, "none", 1),
        "nvidia.com/mig-small": (9, "none", 1),
        "nvidia.com/mig-2g.20gb": (1, "none", 1),
        "nvidia.com/mig-medium": (3, "none", 1),
    },
}


@pytest.mark.parametrize(("config", "node"), sorted(EXPECTED))
def test_example_config_plans_as_documented(config: str, node: str) -> None:
    plans = plan(config, node)
    assert {n: (len(p.devices), p.sharing, p.replicas) for n, p in plans.items()} == EXPECTED[config, node]


def test_every_example_config_is_covered() -> None:
    assert {c for c, _ in EXPECTED} == {p.name for p in CONFIGS.glob("*.yaml")}


def test_shared_examples_refuse_multi_device_requests_where_they_say_so() -> None:
    assert plan("time-slicing-rename.yaml", "dgx-a100")[
        "nvidia.com/gpu.shared"
    ].fail_requests_greater_than_one
    assert not plan("time-slicing.yaml", "dgx-a100")["nvidia.com/gpu"].fail_requests_greater_than_one
    assert plan("mps.yaml", "dgx-h100")["nvidia.com/gpu"].fail_requests_greater_than_one


def test_single_strategy_on_a_mixed_layout_serves_what_is_valid() -> None:
    plans = plan("mig-single.yaml", "a100-mig-mixed")  # GPU 0's seven 1g.10gb; the others are named
    assert [dev.gpu_index for dev in plans["nvidia.com/gpu"].devices] == [0] * 7


def test_mig_ids_are_mig_uuids_and_replicas_map_back() -> None:
    single = plan("mig-single.yaml", "a100-mig-single")["nvidia.com/gpu"]
    assert_all(single.devices, lambda d: d.id.startswith("MIG-") and d.kind == "mig")
    shared = plan("time-slicing.yaml", "dgx-a100")["nvidia.com/gpu"]
    assert [physical_uuid_of(d.id) for d in shared.devices[:4]] == [shared.devices[0].gpu_uuid] * 4
    assert {d.numa_node for d in shared.devices} == {0, 1}


def test_plan_command_prints_json_for_machines() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvidia_device_plugin",
            "plan",
            "--simulate",
            "a100-mig-mixed",
            "--config-file",
            str(CONFIGS / "mig-mixed.yaml"),
            "--output",
            "json",
            "--log-level",
            "warning",
        ],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    counts = {r["name"]: len(r["devices"]) for r in document["resources"]}
    assert counts == {n: c for n, (c, _, _) in EXPECTED["mig-mixed.yaml", "a100-mig-mixed"].items()}


def test_plan_command_reports_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nflags:\n  migStrategy: mix\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvidia_device_plugin",
            "plan",
            "--simulate",
            "t4-single",
            "--config-file",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert proc.returncode == 1
    assert "flags.migStrategy" in proc.stderr and "mix" in proc.stderr

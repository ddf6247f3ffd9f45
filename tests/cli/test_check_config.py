"""`check-config`: several inputs at once (files, ConfigMap directories and manifests, stdin), every mistake
with its hint, what is ignored, and with `--simulate NODE` what `run` would do there.

`plan` and `run` report the same mistakes (tests/cli/test_config_mistakes.py).
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from nvidia_device_plugin.cli.main import main

from support.configs import configmap_volume as configmap_dir
from support.waiting import scaled

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
BENCH_NODES = Path(__file__).resolve().parents[2] / "bench" / "nodes"
# 8 x A100-80GB, each as 7 x 1g.10gb: 56 MIG devices under migStrategy single.
ALL_1G_DGX_A100 = BENCH_NODES / "a100-8x7-mig.yaml"
SINGLE_2048 = "version: v1\nflags: {migStrategy: single}\n" + (
    "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2048}]}}\n"
)


def check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["check-config", *argv], {})
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_several_files_and_a_configmap_directory_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mount = configmap_dir(tmp_path / "cm", {"a100": "version: v1\n", "t4": "flags: {migStrategy: mix}\n"})
    rc, out, err = check(capsys, str(CONFIGS / "mps.yaml"), str(mount))
    assert rc == 1
    assert out.splitlines() == [f"{CONFIGS / 'mps.yaml'}: valid", f"{mount / 'a100'}: valid"]
    assert err.splitlines() == [
        f"{mount / 't4'}: flags.migStrategy must be one of none, single, mixed, got 'mix'",
        "1 of 3 configs are invalid",
    ]


def test_a_configmap_manifest_on_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: plugin-configs}\ndata:\n"
        "  default: |\n    version: v1\n"
        "  a100: |\n    version: v1\n    sharing: {timeSlicing: {resources: [{name: gpu, replica: 4}]}}\n"
    )
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(manifest.encode())))
    rc, out, err = check(capsys, "-")
    assert rc == 1
    assert out == "<stdin>: ConfigMap plugin-configs key default: valid\n"
    where = "<stdin>: ConfigMap plugin-configs key a100"
    assert err.splitlines() == [
        f"{where}: sharing.timeSlicing.resources[0].replica: unknown field (did you mean replicas?)",
        f"{where}: sharing.timeSlicing.resources[0].replicas: required field is missing",
        "1 of 2 configs are invalid",
    ]


def test_stdin_is_read_bounded(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    endless = io.BytesIO(b"#" * (2 * 1024 * 1024))  # a stream past the limit: read up to it, then refused
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(endless))
    rc, _, err = check(capsys, "-")
    assert rc == 1
    assert err.startswith("<stdin>: config file is larger than 1024 KiB")
    assert endless.tell() <= 1024 * 1024 + 1 + io.DEFAULT_BUFFER_SIZE


def test_what_v0_20_ignores_is_said_and_the_config_stays_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "renames.yaml"
    path.write_text("version: v1\nresources: {gpus: [{pattern: '*A100*', name: a100}]}\n")
    rc, out, err = check(capsys, str(path))
    assert (rc, out) == (0, f"{path}: valid\n")
    assert err == (
        f"warning: {path}: resources.gpus: Customizing the 'resources' field is not yet supported in the "
        "config. Ignoring... (NVIDIA v0.20 ignores it too; to apply it, set flags.resourceNaming: true "
        "(--resource-naming, NVDP_RESOURCE_NAMING=true))\n"
    )
    rc, out, err = check(capsys, "--resource-naming", str(path))  # run's flags apply to what is checked
    assert (rc, out, err) == (0, f"{path}: valid\n", "")


def test_without_a_node_the_largest_likely_one_is_assumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "single.yaml"
    path.write_text(SINGLE_2048)
    rc, _, err = check(capsys, str(path))
    assert rc == 1
    assert "on a node with 16 GPUs of 7 MIG devices each, over kubelet's 4,194,304-byte" in err


def test_simulate_refuses_what_run_refuses_on_that_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The case: migStrategy single with 2048 replicas of every 1g.10gb of a DGX A100.
    path = tmp_path / "single.yaml"
    path.write_text(SINGLE_2048)
    rc, out, err = check(capsys, "--simulate", str(ALL_1G_DGX_A100), str(path))
    assert (rc, out) == (1, "")
    assert err == (
        f"{path}: on {ALL_1G_DGX_A100}, run would refuse it: nvidia.com/gpu would advertise 114688 devices "
        "in a ListAndWatch message of 7,507,248 bytes, over kubelet's 4,194,304-byte gRPC receive limit "
        "(kubelet would drop the list and see 0 devices); lower the replicas or share fewer devices\n"
    )
    run = subprocess.run(
        [
            *(sys.executable, "-m", "nvidia_device_plugin", "run", "--simulate", str(ALL_1G_DGX_A100)),
            *("--config-file", str(path), "--device-plugin-path", str(tmp_path), "--metrics-address", ""),
        ],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert run.returncode == 1  # and run does refuse it, with the same sentence
    assert (
        "nvidia.com/gpu would advertise 114688 devices in a ListAndWatch message of 7,507,248 bytes"
        in run.stderr
    )


def test_simulate_prints_the_resources_and_the_warnings_run_would_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ts.yaml"
    path.write_text(
        "version: v1\nflags: {migStrategy: mixed}\n"
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/mig-1g.10gb, replicas: 2}, "
        "{name: nvidia.com/mig-7g.80gb, replicas: 2}]}}\n"
    )
    rc, out, err = check(capsys, "--simulate", "a100-mig-mixed", str(path))
    assert rc == 0
    assert out.startswith(f"{path}: valid on a100-mig-mixed; resources: nvidia.com/gpu: 1 device (1 GPU); ")
    assert "nvidia.com/mig-1g.10gb: " in out and " x 2 replicas, time-slicing)" in out
    assert err == (
        f"warning: {path}: on a100-mig-mixed: config: sharing.timeSlicing.resources[1] shares "
        "nvidia.com/mig-7g.80gb, which no device of this node is advertised as (this node has "
        "nvidia.com/gpu, nvidia.com/mig-1g.10gb, nvidia.com/mig-2g.20gb, nvidia.com/mig-3g.40gb); the entry "
        "is skipped\n"
    )


def test_an_unknown_node_and_an_unreadable_input_are_said_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = check(capsys, "--simulate", "no-such-node", str(CONFIGS / "mps.yaml"))
    assert rc == 1 and err.startswith("--simulate no-such-node: simulated node 'no-such-node' is neither")
    rc, _, err = check(capsys, str(tmp_path / "missing.yaml"), str(tmp_path))
    assert rc == 1
    assert err.splitlines() == [
        f"{tmp_path / 'missing.yaml'}: config file not found",
        f"{tmp_path}: a directory with no config files in it",
        "2 of 2 configs are invalid",
    ]

"""The `nvidia-device-plugin` command line as a user meets it: the commands, the default one, demo, help."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nvidia_device_plugin.cli.main import COMMANDS, build_parser

from support.waiting import scaled


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "nvidia_device_plugin", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_parses_with_its_defaults(command: str) -> None:
    argv = [command, "config.yaml"] if command == "check-config" else [command]
    args = build_parser({}).parse_args(argv)
    assert args.command == command
    assert callable(args.handler)


def test_no_command_is_run() -> None:
    # --metrics-address is run's own flag: any other command would refuse it (exit 2) before starting.
    proc = run_cli("--simulate", "no-such-node", "--metrics-address", "")
    output, _ = proc.communicate(timeout=scaled(30))
    assert proc.returncode == 1, output
    assert "simulated node 'no-such-node' is neither a preset" in output


def test_demo_command() -> None:
    proc = run_cli("demo")
    output, _ = proc.communicate(timeout=scaled(60))
    assert proc.returncode == 0, output
    assert "nvidia.com/gpu: 8 devices" in output
    assert "env NVIDIA_VISIBLE_DEVICES=GPU-" in output


def test_version_and_help() -> None:
    proc = run_cli("--version")
    output, _ = proc.communicate(timeout=scaled(30))
    assert proc.returncode == 0 and output.startswith("nvidia-device-plugin 0.")
    proc = run_cli("--help")
    output, _ = proc.communicate(timeout=scaled(30))
    assert proc.returncode == 0 and all(c in output for c in ("run", "demo", "plan", "check-config"))


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (["mps-control-daemon", "--mps-quit-timeout", "0"], "in (0, 3600], got '0'"),
        (["mps-control-daemon", "--mps-quit-timeout", "soon"], "in (0, 3600], got 'soon'"),
        (["run", "--dra-handover-interval", "61"], "in (0, 60], got '61'"),
        (["run", "--dra-handover-interval", "-1"], "in (0, 60], got '-1'"),
    ],
)
def test_second_flags_refuse_what_is_out_of_their_range(
    argv: list[str], refusal: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser({}).parse_args(argv)
    assert exit_.value.code == 2
    assert f"must be a number of seconds {refusal}" in capsys.readouterr().err


def test_second_flags_take_a_number_in_range() -> None:
    assert (
        build_parser({}).parse_args(["mps-control-daemon", "--mps-quit-timeout", "2.5"]).mps_quit_timeout
        == 2.5
    )
    assert build_parser({}).parse_args(["run", "--dra-handover-interval", "60"]).dra_handover_interval == 60.0

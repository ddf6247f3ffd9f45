"""The `nvidia-device-plugin` command line as a user meets it: the commands, the default one, demo, help."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nvidia_device_plugin.cli import main as cli_main
from nvidia_device_plugin.cli.main import COMMANDS, build_parser, parse_command_line

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


def _others_refuse_to_build(monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("another command's parser was built")

    for name in cli_main._ADD_PARSER:
        if name != command:
            monkeypatch.setitem(cli_main._ADD_PARSER, name, refuse)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["run", "--simulate", "dgx-a100", "--metrics-address", "", "--dra-handover-interval", "60"],
        ["plan", "--simulate", "t4-single", "--output", "json"],
        ["mps-control-daemon", "--mps-quit-timeout", "2.5"],
    ],
)
def test_a_command_named_first_is_parsed_by_its_own_parser_alone(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Start-up: `run` does not pay for six parsers it does not use. Same result as the full parser.
    expected = vars(build_parser({}).parse_args(argv or ["run"]))
    _others_refuse_to_build(monkeypatch, (argv or ["run"])[0])
    assert vars(parse_command_line(argv, {})) == expected


@pytest.mark.parametrize(
    "argv",
    [
        [
            "run",
            "--metrics-adress",
            ":9402",
        ],  # a misspelt option: "did you mean" from every command's options
        ["run", "--dra-handover-interval", "61"],
        ["run", "--help"],
        ["plan", "--simulate"],
    ],
)
def test_what_one_command_parser_would_refuse_or_print_is_said_by_the_full_parser(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as full:
        build_parser({}).parse_args(argv)
    said = capsys.readouterr()
    with pytest.raises(SystemExit) as parsed:
        parse_command_line(argv, {})
    assert parsed.value.code == full.value.code
    assert capsys.readouterr() == said

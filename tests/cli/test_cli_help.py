"""The command line meets a user's mistakes with a "did you mean", and its help says what a user needs: the
commands, the presets, every flag's default."""

from __future__ import annotations

import argparse

import pytest

from nvidia_device_plugin.cli.common import DefaultsHelpFormatter, preset_names
from nvidia_device_plugin.cli.main import COMMANDS, build_parser, main, with_command
from nvidia_device_plugin.nvml.sim import node

from support.checks import assert_all


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(list(argv), {})
    assert exit_.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


def test_a_misspelt_command_gets_a_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    assert usage_error(capsys, "plna") == (
        "nvidia-device-plugin: error: 'plna' is not a command (did you mean plan?); without a command, "
        "run is meant"
    )
    assert "the commands are run, mps-control-daemon, demo, plan, check-config, labels" in usage_error(
        capsys, "frobnicate"
    )


def test_a_command_after_its_options_gets_the_right_order(capsys: pytest.CaptureFixture[str]) -> None:
    assert usage_error(capsys, "--simulate", "dgx-a100", "plan") == (
        "nvidia-device-plugin: error: options go after the command: did you mean "
        "'nvidia-device-plugin plan --simulate dgx-a100'?"
    )


def test_a_misspelt_option_gets_a_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    assert usage_error(capsys, "plan", "--outptu", "json").endswith(
        "unrecognized arguments: --outptu json (--outptu: did you mean --output?)"
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], ["run"]),
        (["--simulate", "t4-single"], ["run", "--simulate", "t4-single"]),
        # The value of an option is never the command: a config, or a node, called "plan" or "labels".
        (
            ["--config-dir", "/c", "--config-name", "plan"],
            ["run", "--config-dir", "/c", "--config-name", "plan"],
        ),
        (
            ["--node-name", "labels", "--pass-device-specs"],
            ["run", "--node-name", "labels", "--pass-device-specs"],
        ),
        (
            ["--pass-device-specs=true", "--mig-strategy", "mixed"],
            ["run", "--pass-device-specs=true", "--mig-strategy", "mixed"],
        ),
        (["plan", "--simulate", "b200"], ["plan", "--simulate", "b200"]),
        (["--help"], ["--help"]),
        (["--simulate", "b200", "--help"], ["run", "--simulate", "b200", "--help"]),
    ],
)
def test_the_command_is_the_first_word_that_is_no_option_value(argv: list[str], expected: list[str]) -> None:
    assert with_command(argv, build_parser({})) == expected


def test_help_lists_the_commands_and_the_presets(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"], {})
    text = " ".join(capsys.readouterr().out.split())
    assert_all(COMMANDS, lambda command: command in text)
    assert (
        "Simulated nodes for --simulate: " + ", ".join(node.preset_names()) + ", or a YAML node file." in text
    )


def test_the_light_preset_list_is_the_simulators() -> None:
    assert preset_names() == node.preset_names()


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.dest not in ("help", "version")]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_of_every_command_shows_its_default(command: str) -> None:
    parser = build_parser({})
    sub = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    assert sub.formatter_class is DefaultsHelpFormatter
    missing = [
        action.option_strings[0]
        for action in _options(sub)
        if "(default" not in " ".join(sub._get_formatter()._format_action(action).split())
    ]
    assert missing == []


def test_flag_defaults_are_the_config_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"], {})
    text = " ".join(capsys.readouterr().out.split())
    for shown in (
        "--mig-strategy VALUE how MIG devices are advertised: none, single or mixed (default: none)",
        "(default: /run/nvidia/mps) [env MPS_ROOT]",
        "(default: uuid) [env DEVICE_ID_STRATEGY]",
        "(default: envvar) [env DEVICE_LIST_STRATEGY]",
        "(default: false) [env NVDP_RESOURCE_NAMING]",
        "--output {table,json} table for people; json for programs",
    ):
        assert shown in text

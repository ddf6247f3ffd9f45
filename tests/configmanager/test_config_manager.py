"""config-manager without the API: NVIDIA's selection rules, its settings, the link, and signalling."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from nvidia_device_plugin.config.selection import (
    ConfigSelectionError,
    FallbackStrategy,
    Selection,
    available_config_names,
    parse_fallback_strategies,
    select_config,
)
from nvidia_device_plugin.configmanager.link import point_link, write_empty_config
from nvidia_device_plugin.configmanager.processes import find_processes, signal_processes
from nvidia_device_plugin.configmanager.settings import SettingsError, parse_settings

from support.signal_targets import signals_recorded, start_recorder
from support.waiting import eventually

NAMED, SINGLE, EMPTY = FallbackStrategy.NAMED, FallbackStrategy.SINGLE, FallbackStrategy.EMPTY

# ---- selection --------------------------------------------------------------------------------------


def test_label_value_wins_over_default_and_fallbacks() -> None:
    chosen = select_config("mig-mixed", ["default", "mig-mixed"], "default", (NAMED,))
    assert chosen == Selection("mig-mixed", "label")


def test_label_naming_a_missing_config_is_an_error_listing_what_exists() -> None:
    with pytest.raises(ConfigSelectionError, match=r"device-plugin.config=mig-mixd names no config") as exc:
        select_config("mig-mixd", ["default", "mig-mixed"], "default", (NAMED, SINGLE, EMPTY))
    assert "available: default, mig-mixed" in str(exc.value)


def test_default_config_without_label() -> None:
    assert select_config("", ["a", "b"], "b", (EMPTY,)) == Selection("b", "default")
    with pytest.raises(ConfigSelectionError, match="DEFAULT_CONFIG=c names no config"):
        select_config("", ["a", "b"], "c", (EMPTY,))


def test_fallback_named_takes_the_config_called_default() -> None:
    assert select_config("", ["a", "default"], "", (NAMED, SINGLE)) == Selection("default", "fallback named")


def test_fallback_single_takes_the_only_config() -> None:
    assert select_config("", ["only"], "", (NAMED, SINGLE)) == Selection("only", "fallback single")
    # Two configs and none called default: named and single both pass, so nothing is chosen.
    with pytest.raises(ConfigSelectionError, match=r"fallback strategies \(named,single\) found nothing"):
        select_config("", ["a", "b"], "", (NAMED, SINGLE))


def test_fallback_empty_takes_the_empty_config_and_order_matters() -> None:
    assert select_config("", ["a", "b"], "", (NAMED, SINGLE, EMPTY)) == Selection(None, "fallback empty")
    assert select_config("", ["only"], "", (EMPTY, SINGLE)) == Selection(None, "fallback empty")
    assert select_config("", [], "", (EMPTY,)) == Selection(None, "fallback empty")


def test_fallback_strategies_parse_in_order_and_reject_unknown_names() -> None:
    assert parse_fallback_strategies("named,single") == (NAMED, SINGLE)
    assert parse_fallback_strategies(" empty , named ") == (EMPTY, NAMED)
    assert parse_fallback_strategies("") == ()
    with pytest.raises(
        ConfigSelectionError, match=r"unknown strategy 'singel'.*allowed: named, single, empty"
    ):
        parse_fallback_strategies("named,singel")
    with pytest.raises(ConfigSelectionError, match="listed twice"):
        parse_fallback_strategies("named,named")


def test_available_names_skip_kubelets_configmap_bookkeeping(tmp_path: Path) -> None:
    # The layout kubelet gives a mounted ConfigMap: a timestamped dir, ..data, one symlink per key.
    data = tmp_path / "..2026_01_01_00_00_00.000000001"
    data.mkdir()
    for key in ("mig-mixed", "time-slicing"):
        (data / key).write_text("version: v1\n")
        (tmp_path / key).symlink_to(Path("..data") / key)
    (tmp_path / "..data").symlink_to(data.name)
    assert available_config_names(tmp_path) == ["mig-mixed", "time-slicing"]
    with pytest.raises(ConfigSelectionError, match="does not exist"):
        available_config_names(tmp_path / "missing")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(ConfigSelectionError, match="cannot list the configs"):
        available_config_names(loop)  # any OSError is a ConfigSelectionError, which the manager handles


# ---- settings ------------------------------------------------------------------------------------------

REQUIRED = {"NODE_NAME": "gpu-1", "CONFIG_FILE_SRCDIR": "/available-configs", "CONFIG_FILE_DST": "/config/c"}


def test_settings_have_nvidias_defaults() -> None:
    """Its binary's: no fallback strategies (only NVIDIA's chart sets named,single), SEND_SIGNAL true."""
    settings = parse_settings([], REQUIRED)
    assert settings.node_label == "nvidia.com/device-plugin.config"
    assert settings.fallback_strategies == ()
    assert settings.oneshot is False and settings.send_signal is True
    assert settings.signal == signal.SIGHUP
    assert settings.process_to_signal == "nvidia-device-plugin"


def test_empty_variables_read_as_nvidias_flag_library_reads_them() -> None:
    """Empty: a number keeps its default, a switch is false, a list is empty (the Operator: `SIGNAL: ""`)."""
    empty = parse_settings(
        [], {**REQUIRED, "SIGNAL": "", "SEND_SIGNAL": "", "ONESHOT": "", "FALLBACK_STRATEGIES": ""}
    )
    assert (empty.signal, empty.send_signal, empty.oneshot) == (signal.SIGHUP, False, False)
    assert empty.fallback_strategies == ()
    assert parse_settings(["--send-signal=false"], REQUIRED).send_signal is False
    assert parse_settings(["--send-signal"], {**REQUIRED, "SEND_SIGNAL": "false"}).send_signal is True


def test_flags_win_over_environment() -> None:
    env = {**REQUIRED, "ONESHOT": "true", "SIGNAL": "SIGUSR1", "FALLBACK_STRATEGIES": "empty"}
    settings = parse_settings(["--node-name", "gpu-2", "--default-config", "a"], env)
    assert (settings.node_name, settings.default_config) == ("gpu-2", "a")
    assert settings.oneshot is True
    assert settings.signal == signal.SIGUSR1
    assert settings.fallback_strategies == (EMPTY,)


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"NODE_NAME": ""}, r"NODE_NAME \(or --node-name\) must be set"),
        ({"CONFIG_FILE_DST": " "}, "CONFIG_FILE_DST"),
        ({"ONESHOT": "maybe"}, "ONESHOT must be true or false, got 'maybe'"),
        ({"SIGNAL": "SIGNOPE"}, "SIGNAL must be a signal number or name"),
        ({"FALLBACK_STRATEGIES": "first"}, "unknown strategy 'first'"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], problem: str) -> None:
    with pytest.raises(SettingsError, match=problem):
        parse_settings([], {**REQUIRED, **env})


# ---- the link ------------------------------------------------------------------------------------------


def test_link_is_replaced_atomically_and_reports_changes(tmp_path: Path) -> None:
    dst = tmp_path / "config.yaml"
    assert point_link(dst, tmp_path / "a") is True
    assert os.readlink(dst) == str(tmp_path / "a")
    assert point_link(dst, tmp_path / "a") is False
    assert point_link(dst, tmp_path / "b") is True
    assert os.readlink(dst) == str(tmp_path / "b")
    assert write_empty_config(dst) is True
    assert not dst.is_symlink() and dst.read_bytes() == b""
    assert write_empty_config(dst) is False
    assert point_link(dst, tmp_path / "a") is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"], "a temporary file was left behind"


# ---- signalling ------------------------------------------------------------------------------------------


def test_signal_reaches_a_python_script_by_its_process_name(tmp_path: Path) -> None:
    # As the plugin runs: `/usr/local/bin/nvidia-device-plugin run` exec'd by its `#!` line, argv[0] is the
    # interpreter and the kernel names the process after the script (cut to 15 bytes: this name is longer).
    name = f"fake-plugin-{os.getpid():08d}"
    marker = tmp_path / "got-hup"
    target = start_recorder(tmp_path / name, marker)
    try:
        assert find_processes(name) == [target.pid]
        assert signal_processes(name, signal.SIGHUP) == [target.pid]
        assert eventually(lambda: signals_recorded(marker) == 1), "the handler runs in the other process"
    finally:
        target.kill()
        target.wait()


def test_a_name_only_on_a_command_line_is_not_signalled(tmp_path: Path) -> None:
    """`python3 <dir>/<name>` is a process named python3: the name on its command line does not make it
    the process to signal (a build, an editor, a demo run from a checkout named so)."""
    name = f"decoy-{os.getpid()}"
    marker = tmp_path / "got-hup"
    decoy = start_recorder(tmp_path / name, marker, by_interpreter=True)
    try:
        assert find_processes(name) == []
        assert signal_processes(name, signal.SIGHUP) == []
        time.sleep(0.2)  # a signal, had one been sent, is handled by now
        assert signals_recorded(marker) == 0
    finally:
        decoy.kill()
        decoy.wait()


def test_config_manager_never_finds_itself() -> None:
    own_name = Path("/proc/self/comm").read_text().strip()  # this test's process: python3.x or pytest
    assert len(own_name) < 15, f"{own_name!r} is cut: the test needs a whole name"
    assert os.getpid() not in find_processes(own_name)


def test_no_process_to_signal_is_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    assert signal_processes(f"no-such-process-{os.getpid()}", signal.SIGHUP) == []
    assert "reloads the re-pointed config by itself" in caplog.text

"""The `config-manager` command as a separate process against the stand-in API server: the defaults of
NVIDIA's binary (no fallback strategies, SEND_SIGNAL=true with SIGHUP) and how it stops (SIGTERM, SIGINT).

Every process is ended by the test (SIGTERM, else SIGKILL in `finally`). Where SEND_SIGNAL is left at its
default, PROCESS_TO_SIGNAL names a process of this test only, so no other process on the machine is signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.fake_apiserver import LABEL, FakeApiServer
from support.namespaces import pid_namespace_prefix
from support.programs import config_manager_environment
from support.signal_targets import start_recorder
from support.waiting import scaled, wait_for

COMMAND = str(Path(sys.executable).parent / "config-manager")


def _target(tmp_path: Path) -> str | None:
    dst = tmp_path / "config.yaml"
    return os.readlink(dst) if dst.is_symlink() else None


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=scaled(30))


def _start(
    started: list[subprocess.Popen[str]], argv: list[str], env: dict[str, str]
) -> subprocess.Popen[str]:
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started.append(process)
    return process


# ---- defaults ----------------------------------------------------------------------------------------------


def test_without_fallback_strategies_an_unlabelled_node_gets_no_config(tmp_path: Path) -> None:
    """NVIDIA's binary has no default strategies (only its chart sets `named,single`): exit 1, no link."""
    with FakeApiServer({}) as server:
        env = config_manager_environment(
            tmp_path, server.url, ["default", "x"], ONESHOT="true", SEND_SIGNAL="false"
        )
        bare = subprocess.run(
            [COMMAND], env=env, capture_output=True, text=True, timeout=scaled(60), check=False
        )
        assert bare.returncode == 1, bare.stderr
        assert "fallback strategies (none) found nothing (available: default, x)" in bare.stderr
        assert _target(tmp_path) is None
        charted = {**env, "FALLBACK_STRATEGIES": "named,single"}  # as the charts set it
        done = subprocess.run(
            [COMMAND], env=charted, capture_output=True, text=True, timeout=scaled(60), check=False
        )
    assert done.returncode == 0, done.stderr
    assert _target(tmp_path) == str(tmp_path / "available-configs" / "default")


def test_without_send_signal_a_change_sends_sighup(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    name = f"fake-plugin-{os.getpid()}"
    marker = tmp_path / "signals"
    plugin = start_recorder(tmp_path / name, marker)  # named as the plugin is: by its script
    processes.append(plugin)
    with FakeApiServer({LABEL: "a"}) as server:
        # SEND_SIGNAL and SIGNAL unset
        env = config_manager_environment(tmp_path, server.url, ["a", "b"], PROCESS_TO_SIGNAL=name)
        manager = _start(processes, [COMMAND], env)
        wait_for(lambda: marker.exists() and marker.read_text() == "hup\n", "SIGHUP after the first link")
        wait_for(lambda: len(server.watches()) == 1, "the watch")
        server.set_label("b")
        wait_for(lambda: marker.read_text() == "hup\nhup\n", "SIGHUP after the label change")
        manager.send_signal(signal.SIGTERM)
        _, err = manager.communicate(timeout=scaled(30))
    assert _target(tmp_path) == str(tmp_path / "available-configs" / "b")
    assert f"sent signal 1 to {name} (pid {plugin.pid})" in err


def test_an_empty_send_signal_means_false(tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    """As NVIDIA's flag library reads an empty switch variable: false, not the default."""
    with FakeApiServer({LABEL: "a"}) as server:
        env = config_manager_environment(
            tmp_path, server.url, ["a"], SEND_SIGNAL="", PROCESS_TO_SIGNAL=f"none-{os.getpid()}"
        )
        manager = _start(processes, [COMMAND], env)
        wait_for(lambda: len(server.watches()) == 1, "the watch (the link and any signal come before it)")
        manager.send_signal(signal.SIGTERM)
        _, err = manager.communicate(timeout=scaled(30))
    assert _target(tmp_path) == str(tmp_path / "available-configs" / "a")
    assert "sent signal" not in err and "no process named" not in err, err


# ---- stopping ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_the_sidecar_quietly_killed_by_that_signal(
    tmp_path: Path, processes: list[subprocess.Popen[str]], signum: signal.Signals
) -> None:
    """As NVIDIA's Go binary, which has no handler: the process dies of the signal (the container runtime
    reports 128 + its number: 143 for SIGTERM). One INFO line says why; no ERROR, no traceback."""
    with FakeApiServer({LABEL: "a"}) as server:
        manager = _start(
            processes, [COMMAND], config_manager_environment(tmp_path, server.url, ["a"], SEND_SIGNAL="false")
        )
        wait_for(lambda: len(server.watches()) == 1, "the watch")
        manager.send_signal(signum)
        _, err = manager.communicate(timeout=scaled(30))
    assert manager.returncode == -signum, err
    assert f"INFO nvidia_device_plugin.configmanager: config-manager: {signum.name} received" in err, err
    assert "ERROR" not in err and "Traceback" not in err, err
    assert _target(tmp_path) == str(tmp_path / "available-configs" / "a"), "the link stays"


def _only_child(pid: int) -> int | None:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(children[0]) if len(children) == 1 else None


def test_as_pid_1_of_its_container_sigterm_gives_exit_status_143(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """A pod without shareProcessNamespace (this chart's) makes config-manager PID 1 of its container, and
    the kernel drops a default-action signal PID 1 sends itself: the status is then 143 by exit code."""
    prefix = pid_namespace_prefix("here")
    with FakeApiServer({LABEL: "a"}) as server:
        env = config_manager_environment(tmp_path, server.url, ["a"], SEND_SIGNAL="false")
        unshare = _start(processes, [*prefix, COMMAND], env)
        wait_for(lambda: len(server.watches()) == 1, "the watch")
        child = _only_child(unshare.pid)
        assert child is not None, "unshare runs config-manager as its only child"
        os.kill(child, signal.SIGTERM)  # from outside its namespace, as the container runtime sends it
        _, err = unshare.communicate(timeout=scaled(30))
    assert unshare.returncode == 143, err
    assert "config-manager: SIGTERM received" in err and "ERROR" not in err, err

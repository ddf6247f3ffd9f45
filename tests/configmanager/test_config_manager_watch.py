"""config-manager against a stand-in API server speaking the node list and watch API over real HTTP.

The stand-in (127.0.0.1 only) answers `GET /api/v1/nodes?fieldSelector=metadata.name=<node>` with a NodeList,
and the same with `watch=true` with a stream of JSON lines (`{"type": "MODIFIED", "object": <Node>}`) that the
test feeds: label changes, a stream end (the client reconnects from the last resourceVersion), and an ERROR
event with a 410 Status (the client lists again). Every loop here is bounded and every server stops.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nvidia_device_plugin.configmanager.manager import ConfigManager
from nvidia_device_plugin.configmanager.nodewatch import api_client_for
from nvidia_device_plugin.configmanager.settings import parse_settings

from support.fake_apiserver import CLOSE_STREAM, LABEL, NODE, FakeApiServer
from support.programs import config_manager_environment
from support.waiting import scaled, wait_for


def _configs(tmp_path: Path, names: list[str]) -> Path:
    srcdir = tmp_path / "available-configs"
    srcdir.mkdir()
    for name in names:
        (srcdir / name).write_text(f"# {name}\nversion: v1\n")
    return srcdir


def _target(dst: Path) -> str | None:
    return os.readlink(dst) if dst.is_symlink() else None


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Callable[..., tuple[FakeApiServer, Path, Path]]]:
    """Start a fake server and a ConfigManager following it in a thread; both are stopped afterwards."""
    started: list[tuple[FakeApiServer, threading.Event, threading.Thread]] = []

    def start(labels: dict[str, str], names: list[str], **env: str) -> tuple[FakeApiServer, Path, Path]:
        srcdir = _configs(tmp_path, names)
        dst = tmp_path / "config" / "config.yaml"
        dst.parent.mkdir()
        required = {"NODE_NAME": NODE, "CONFIG_FILE_SRCDIR": str(srcdir), "CONFIG_FILE_DST": str(dst)}
        # SEND_SIGNAL defaults to true: never signal the machine's other `nvidia-device-plugin` processes.
        settings = parse_settings([], {**required, "SEND_SIGNAL": "false", **env})
        server = FakeApiServer(labels).__enter__()
        stop = threading.Event()
        manager = ConfigManager(settings, api_client_for(server.url))
        thread = threading.Thread(target=manager.run, args=(stop,), name="config-manager")
        thread.start()
        started.append((server, stop, thread))
        return server, srcdir, dst

    yield start
    for server, stop, thread in started:
        stop.set()
        server.__exit__()  # ends the open watch stream, so the manager's read returns
        thread.join(timeout=scaled(30))
        assert not thread.is_alive(), "the config-manager loop did not stop"


def test_label_change_repoints_the_link(running: Any) -> None:
    server, srcdir, dst = running({LABEL: "time-slicing"}, ["time-slicing", "mig-mixed"])
    wait_for(lambda: _target(dst) == str(srcdir / "time-slicing"), "the first link")
    wait_for(lambda: len(server.watches()) == 1, "the watch")
    assert server.watches()[0]["resourceVersion"] == ["100"], "the watch must start where the list ended"
    server.set_label("mig-mixed")
    wait_for(lambda: _target(dst) == str(srcdir / "mig-mixed"), "the link to follow the label")
    server.set_label(None)  # label removed, no DEFAULT_CONFIG, no fallback strategies: link kept
    server.set_label("time-slicing")
    wait_for(lambda: _target(dst) == str(srcdir / "time-slicing"), "the link to follow the label back")


def test_watch_reconnects_from_the_last_resource_version(running: Any) -> None:
    server, srcdir, dst = running({LABEL: "a"}, ["a", "b", "c"])
    wait_for(lambda: len(server.watches()) == 1, "the watch")
    server.set_label("b")
    wait_for(lambda: _target(dst) == str(srcdir / "b"), "label b")
    server.feed.put(CLOSE_STREAM)  # as an API server does after timeoutSeconds
    wait_for(lambda: len(server.watches()) == 2, "a second watch")
    assert server.watches()[1]["resourceVersion"] == ["101"]
    assert len(server.lists()) == 1, "a plain stream end needs no new list"
    server.set_label("c")
    wait_for(lambda: _target(dst) == str(srcdir / "c"), "label c over the new watch")


def test_410_gone_relists_and_catches_up(running: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    server, srcdir, dst = running({LABEL: "a"}, ["a", "b"])
    wait_for(lambda: len(server.watches()) == 1, "the watch")
    server.set_label("b", announce=False)  # a change the watch missed: only a new list can see it
    server.expire_watch()
    wait_for(lambda: _target(dst) == str(srcdir / "b"), "the relisted label")
    assert len(server.lists()) == 2
    wait_for(lambda: len(server.watches()) == 2, "a watch from the new list")
    assert server.watches()[1]["resourceVersion"] == ["101"]
    assert "expired" in caplog.text


def test_missing_config_name_keeps_the_previous_link(running: Any, caplog: pytest.LogCaptureFixture) -> None:
    server, srcdir, dst = running({LABEL: "a"}, ["a", "b"])
    wait_for(lambda: len(server.watches()) == 1, "the watch")
    server.set_label("typo")
    server.set_label("b")
    wait_for(lambda: _target(dst) == str(srcdir / "b"), "the next good label")
    assert f"{LABEL}=typo names no config (available: a, b)" in caplog.text


@pytest.mark.parametrize(
    ("env", "names", "expected"),
    [
        ({"FALLBACK_STRATEGIES": "named,single"}, ["default", "x"], "default"),  # named, as the charts set
        ({"FALLBACK_STRATEGIES": "named,single"}, ["only"], "only"),  # single
        ({"FALLBACK_STRATEGIES": "empty"}, ["x", "y"], None),  # empty: an empty regular file
        ({"DEFAULT_CONFIG": "y"}, ["x", "y"], "y"),
    ],
)
def test_unlabelled_node_uses_default_and_fallbacks(
    running: Any, env: dict[str, str], names: list[str], expected: str | None
) -> None:
    server, srcdir, dst = running({}, names, **env)
    wait_for(lambda: len(server.watches()) == 1, "the watch")
    if expected is None:
        assert dst.is_file() and not dst.is_symlink() and dst.read_bytes() == b""
    else:
        assert _target(dst) == str(srcdir / expected)


def test_without_fallbacks_the_sidecar_waits_for_a_label(
    running: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """NVIDIA's binary (no strategies by default) exits 1 here, and so does the `config-manager` command
    (test_config_manager_nvidia_parity.py); ConfigManager as the daemon runs it (`--node-config-label`) logs
    why, keeps watching and links the config the label names once the node gets one."""
    server, srcdir, dst = running({}, ["default", "x"])
    wait_for(lambda: len(server.watches()) == 1, "the watch")
    assert not dst.exists() and not dst.is_symlink()
    assert "fallback strategies (none) found nothing (available: default, x)" in caplog.text
    server.set_label("x")
    wait_for(lambda: _target(dst) == str(srcdir / "x"), "the link to the labelled config")


def test_oneshot_command_links_once_and_exits(tmp_path: Path) -> None:
    """The console script as the init container runs it: ONESHOT, credentials from $KUBECONFIG."""
    srcdir = tmp_path / "available-configs"
    dst = tmp_path / "config.yaml"
    with FakeApiServer({LABEL: "b"}) as server:
        env = config_manager_environment(
            tmp_path,
            server.url,
            ["a", "b"],
            ONESHOT="true",
            SEND_SIGNAL="false",  # its default is true: never signal the machine's plugin processes
        )
        command = [str(Path(sys.executable).parent / "config-manager")]
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=scaled(60), check=False
        )
        assert done.returncode == 0, done.stderr
        assert _target(dst) == str(srcdir / "b")
        assert server.watches() == [], "ONESHOT must not watch"
        server.set_label("missing", announce=False)
        failed = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=scaled(60), check=False
        )
    assert failed.returncode == 1
    assert f"{LABEL}=missing names no config (available: a, b)" in failed.stderr
    assert _target(dst) == str(srcdir / "b"), "a failed ONESHOT must leave the link alone"


def test_a_malformed_watch_event_is_logged_and_the_watch_goes_on(
    running: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server, srcdir, dst = running({LABEL: "a"}, ["a", "b"])
    wait_for(lambda: len(server.watches()) == 1, "the watch")
    server.feed.put({"type": "MODIFIED", "object": ["not", "a", "node"]})  # nothing a real server sends
    wait_for(lambda: len(server.lists()) >= 2, "a new list after the bad event")
    server.set_label("b")
    wait_for(lambda: _target(dst) == str(srcdir / "b"), "the label followed after the bad event")
    assert "config-manager:" in caplog.text

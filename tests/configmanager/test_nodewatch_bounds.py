"""The node watch under a misbehaving API server (issue 23 items 14 and 15): `410 Gone` on every watch is
answered with client-go's relist backoff, not a tight loop; a watch line past the size bound is refused
with an error that says so, and the watch lists again.

Both commands that follow the label (`config-manager`, `run --node-config-label`) run ConfigManager; it
runs here in a thread against the stand-in API server over real HTTP, and the `config-manager` console
script as its own process. The API server counts every request.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest

from nvidia_device_plugin.configmanager import nodewatch
from nvidia_device_plugin.configmanager.manager import ConfigManager
from nvidia_device_plugin.configmanager.nodewatch import api_client_for
from nvidia_device_plugin.configmanager.settings import parse_settings

from support.fake_apiserver import LABEL, NODE, FakeApiServer
from support.programs import config_manager_environment
from support.waiting import scaled, wait_for


class Start(Protocol):
    """Follows `server` with a ConfigManager (its relist backoff starting at `relist_initial_s`)."""

    def __call__(self, server: FakeApiServer, relist_initial_s: float = ...) -> Path: ...


@pytest.fixture
def following(tmp_path: Path) -> Iterator[Start]:
    """Run a ConfigManager against `server` in a thread (stopped afterwards); returns the link it keeps."""
    started: list[tuple[threading.Event, threading.Thread, ConfigManager]] = []

    def start(server: FakeApiServer, relist_initial_s: float = nodewatch.RELIST_INITIAL_S) -> Path:
        srcdir = tmp_path / "configs"
        srcdir.mkdir()
        for name in ("a", "b"):
            (srcdir / name).write_text("version: v1\n")
        dst = tmp_path / "config.yaml"
        env = {"NODE_NAME": NODE, "CONFIG_FILE_SRCDIR": str(srcdir), "CONFIG_FILE_DST": str(dst)}
        env["SEND_SIGNAL"] = "false"  # its default is true: never signal the machine's plugin processes
        manager = ConfigManager(
            parse_settings([], env), api_client_for(server.url), relist_initial_s=relist_initial_s
        )
        stop = threading.Event()
        thread = threading.Thread(target=manager.run, args=(stop,), name="config-manager")
        thread.start()
        started.append((stop, thread, manager))
        return dst

    yield start
    for stop, thread, manager in started:
        stop.set()
        manager.interrupt()
        thread.join(timeout=scaled(30))
        assert not thread.is_alive(), "the config-manager loop did not stop"


def list_times(server: FakeApiServer, count: int, timeout: float) -> list[float]:
    """When each of the first `count` lists arrived, as the server stamped them (a pause of the test's
    thread does not move them)."""
    wait_for(lambda: len(server.list_times) >= count, f"{count} lists", timeout=timeout)
    return server.list_times[:count]


def test_410_on_every_watch_backs_off_as_client_gos_reflector(following: Start) -> None:
    with FakeApiServer({LABEL: "a"}) as server:
        for _ in range(200):
            server.expire_watch()  # every watch gets 410 at once
        following(server, relist_initial_s=0.1)
        times = list_times(server, 5, timeout=scaled(30))
        assert len(times) == 5, f"only {len(server.lists())} lists"
        gaps = [b - a for a, b in itertools.pairwise(times)]
        # Each relist waits at least the backoff: 0.1 s doubling (plus up to as much again, at random).
        for n, gap in enumerate(gaps):
            assert gap >= 0.1 * 2**n * 0.9, f"relist {n + 1} came {gap:.3f}s after the one before: {gaps}"


def test_the_relist_backoff_is_client_gos() -> None:
    backoff = nodewatch.RelistBackoff()
    delays = [backoff.delay() for _ in range(9)]
    bases = [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0, 30.0]
    for delay, base in zip(delays, bases, strict=True):
        assert base <= delay < 2 * base, (delay, base)


def test_the_config_manager_sidecar_does_not_hammer_an_api_server_that_expires_every_watch(
    tmp_path: Path,
) -> None:
    with FakeApiServer({LABEL: "a"}) as server:
        for _ in range(500):
            server.expire_watch()
        # SEND_SIGNAL: its default is true; never signal the machine's plugin processes
        env = config_manager_environment(tmp_path, server.url, ["a"], SEND_SIGNAL="false")
        command = [str(Path(sys.executable).parent / "config-manager")]
        process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: len(server.watches()) >= 1, "the first watch", timeout=scaled(30))
            time.sleep(3.0)  # an observation window: a tight loop made ~120 requests in it
            lists = len(server.lists())
        finally:
            process.terminate()
            _, err = process.communicate(timeout=scaled(30))
    # Lists at 0 s, then after >= 0.8 s and >= 1.6 s more: at most 3 in the window, 4 with the first.
    assert lists <= 4, f"{lists} lists in 3 s"
    assert "expired" in err


def test_a_watch_line_past_the_bound_is_refused_and_the_watch_lists_again(
    following: Start, caplog: pytest.LogCaptureFixture
) -> None:
    with FakeApiServer({LABEL: "a"}) as server:
        dst = following(server)
        wait_for(lambda: len(server.watches()) == 1, "the watch")
        huge = {"type": "MODIFIED", "object": json.loads(json.dumps(server.node))}
        huge["object"]["metadata"]["labels"][LABEL] = "x" * (48 * 1024 * 1024)  # a 48 MiB line
        server.feed.put(huge)
        wait_for(lambda: len(server.lists()) >= 2, "a new list after the refused line", timeout=scaled(60))
        assert "sent more than 8 MiB in one answer" in caplog.text
        assert os.readlink(dst).endswith("/a"), "the refused event must change nothing"
        server.set_label("b")
        wait_for(lambda: os.readlink(dst).endswith("/b"), "the label followed after the refused line")

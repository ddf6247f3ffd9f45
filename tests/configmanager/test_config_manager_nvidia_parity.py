"""config-manager under the GPU Operator's env and a misbehaving API server (issue 32 items 6, 7, 8b), and
where it behaves as NVIDIA's command does (issue 31): every request and ONESHOT as a whole bounded, a
NodeList of the wrong shape a clear error, label values escaped and bounded in the log, watches that end
early reopened after a backoff, exit 1 on a bad label or no process to signal, `empty` linked to /dev/null.

Every process here is started and ended by the test; SEND_SIGNAL is off, or PROCESS_TO_SIGNAL names no
process on the machine (the conftest's decoy fails a test that signals anything else).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.document import read_config_document
from nvidia_device_plugin.configmanager import nodewatch
from nvidia_device_plugin.configmanager.manager import ConfigManager
from nvidia_device_plugin.configmanager.nodewatch import api_client_for
from nvidia_device_plugin.configmanager.processes import find_processes
from nvidia_device_plugin.configmanager.settings import parse_settings

from support.fake_apiserver import CLOSE_STREAM, LABEL, NODE, FakeApiServer
from support.programs import config_manager_environment
from support.waiting import scaled, wait_for

COMMAND = str(Path(sys.executable).parent / "config-manager")


def _run(env: dict[str, str], timeout: float = scaled(90)) -> subprocess.CompletedProcess[str]:
    # The timeout only ends a hung run; it is no speed assertion.
    return subprocess.run([COMMAND], env=env, capture_output=True, text=True, timeout=timeout, check=False)


class _SilentServer:
    """Accepts connections on 127.0.0.1 and never answers (an API server stuck behind its listener)."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                self._accepted.append(self._listener.accept()[0])
            except OSError:
                return

    def __enter__(self) -> _SilentServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._listener.close()
        for connection in self._accepted:
            connection.close()


@pytest.fixture
def answering() -> Iterator[Callable[[bytes], str]]:
    """A server answering every GET with `body` (200, JSON)."""
    servers: list[ThreadingHTTPServer] = []

    def start(body: bytes) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


# ---- item 6: bounded requests, bounded ONESHOT, clear errors -----------------------------------------------


def test_oneshot_against_an_api_server_that_never_answers_exits_1_naming_the_wait(tmp_path: Path) -> None:
    with _SilentServer() as server:
        done = _run(
            config_manager_environment(tmp_path, server.url, ["a"], ONESHOT="true", SEND_SIGNAL="false")
        )
    assert done.returncode == 1, done.stderr
    assert f"reading label {LABEL} of node {NODE} from the API (up to 30 s" in done.stderr
    assert "timed out" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_oneshot_is_bounded_as_a_whole(tmp_path: Path) -> None:
    """Past each request's timeouts (a server trickling its answer passes every read timeout)."""
    settings = parse_settings(
        [],
        {
            "NODE_NAME": NODE,
            "CONFIG_FILE_SRCDIR": str(tmp_path),
            "CONFIG_FILE_DST": str(tmp_path / "c"),
            "SEND_SIGNAL": "false",
        },
    )
    with _SilentServer() as server:
        assert ConfigManager(settings, api_client_for(server.url), oneshot_timeout_s=0.5).run_once() == 1


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"kind": "NodeList", "items": "gpu-node-1"}', "items is a string, not a list"),
        (b'{"kind": "NodeList", "items": ["gpu-node-1"]}', "is a string, not an object"),
        (b'{"items": [{"metadata": {"labels": ["x"]}}]}', "metadata.labels is a list, not an object"),
        (b'["not", "a", "list"]', "the list of node gpu-node-1 is a list, not an object"),
    ],
)
def test_a_nodelist_of_the_wrong_shape_is_a_clear_error(
    tmp_path: Path, answering: Callable[[bytes], str], body: bytes, problem: str
) -> None:
    url = answering(body)
    done = _run(config_manager_environment(tmp_path, url, ["a"], ONESHOT="true", SEND_SIGNAL="false"))
    assert done.returncode == 1, done.stderr
    assert problem in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


# ---- item 7: label values in log lines ---------------------------------------------------------------------


def test_a_label_value_cannot_forge_a_log_line_or_reach_the_terminal(tmp_path: Path) -> None:
    forged = "x\n2026-01-01 00:00:00,000 INFO forged: all is well\x1b[2J"
    with FakeApiServer({LABEL: forged}) as server:
        done = _run(
            config_manager_environment(tmp_path, server.url, ["a"], ONESHOT="true", SEND_SIGNAL="false")
        )
    assert done.returncode == 1
    assert "\x1b" not in done.stderr
    assert not any(line.startswith("2026-01-01") for line in done.stderr.splitlines()), done.stderr
    assert "names no config" in done.stderr and "\\n2026-01-01" in done.stderr


def test_a_huge_label_value_is_logged_cut(tmp_path: Path) -> None:
    with FakeApiServer({LABEL: "v" * 300_000}) as server:
        done = _run(
            config_manager_environment(tmp_path, server.url, ["a"], ONESHOT="true", SEND_SIGNAL="false")
        )
    assert done.returncode == 1
    assert "(300000 characters in all)" in done.stderr
    assert "names no config (available: a)" in done.stderr, "the cut keeps the rest of the line"
    assert len(done.stderr) < 8_000, f"{len(done.stderr)} characters logged"


# ---- item 8b: a watch that ends after each event -----------------------------------------------------------


def _follow_in_thread(
    tmp_path: Path, server: FakeApiServer, **bounds: float
) -> tuple[threading.Event, threading.Thread]:
    """ConfigManager following `server` in a thread; `bounds` (watch_healthy_s, ...) as given."""
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "a").write_text("version: v1\n")
    env = {
        "NODE_NAME": NODE,
        "CONFIG_FILE_SRCDIR": str(tmp_path / "configs"),
        "CONFIG_FILE_DST": str(tmp_path / "config.yaml"),
        "SEND_SIGNAL": "false",
    }
    manager = ConfigManager(parse_settings([], env), api_client_for(server.url), **bounds)
    stop = threading.Event()
    thread = threading.Thread(target=manager.run, args=(stop,), name="config-manager")
    thread.start()
    return stop, thread


def _watches(tmp_path: Path, enough: Callable[[FakeApiServer], object], **bounds: float) -> int:
    """Follow a server whose every watch delivers one event and ends, until `enough` says so; how many
    watches it saw."""
    with FakeApiServer({LABEL: "a"}) as server:
        for _ in range(300):  # every watch: one event, then the stream ends
            server.set_label("a")
            server.feed.put(CLOSE_STREAM)
        stop, thread = _follow_in_thread(tmp_path, server, **bounds)
        try:
            wait_for(lambda: len(server.watches()) >= 1, "the first watch", timeout=scaled(30))
            enough(server)
            count = len(server.watches())
        finally:
            stop.set()
            server.__exit__()
            thread.join(timeout=scaled(30))
    assert not thread.is_alive()
    return count


def test_watches_that_end_after_one_event_are_reopened_after_client_gos_backoff(tmp_path: Path) -> None:
    # 0.8 s, then 1.6 s more (each up to twice that): at most 3 watches in 3 s; a loop made ~40.
    count = _watches(tmp_path, lambda _: time.sleep(3.0))  # an observation window: load only lowers it
    assert count <= 4, f"{count} watches in 3 s"


def test_a_watch_that_lived_long_enough_resets_the_backoff(tmp_path: Path) -> None:

    def eight_watches(server: FakeApiServer) -> None:
        # Without the reset, the 8th watch would come after 0.8 + 1.6 + ... + 30 s >= 80 s of backoff.
        wait_for(lambda: len(server.watches()) >= 8, "8 watches, each reopened at once", timeout=scaled(60))

    assert _watches(tmp_path, eight_watches, watch_healthy_s=0.0) >= 8  # every watch counts as healthy


def test_the_backoff_starts_again_after_reset() -> None:
    backoff = nodewatch.RelistBackoff()
    for _ in range(5):
        backoff.delay()
    backoff.reset()
    assert 0.8 <= backoff.delay() < 1.6


# ---- issue 31: as NVIDIA's command -----------------------------------------------------------------------


def test_the_sidecar_exits_1_on_a_label_naming_no_config(tmp_path: Path) -> None:
    with FakeApiServer({LABEL: "a"}) as server:
        env = config_manager_environment(tmp_path, server.url, ["a"], SEND_SIGNAL="false")
        process = subprocess.Popen([COMMAND], env=env, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: len(server.watches()) == 1, "the watch")
            server.set_label("typo")
            _, err = process.communicate(timeout=scaled(60))
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 1, err
    assert f"{LABEL}=typo names no config (available: a)" in err
    assert os.readlink(tmp_path / "config.yaml") == str(tmp_path / "available-configs" / "a"), "link kept"


def test_no_process_to_signal_exits_1_in_oneshot_and_in_the_sidecar(tmp_path: Path) -> None:
    nobody = f"no-such-plugin-{os.getpid()}"
    with FakeApiServer({LABEL: "a"}) as server:
        # SEND_SIGNAL unset: its default, true
        env = config_manager_environment(tmp_path, server.url, ["a"], PROCESS_TO_SIGNAL=nobody)
        sidecar = _run(env, timeout=scaled(60))
        (tmp_path / "config.yaml").unlink()
        oneshot = _run({**env, "ONESHOT": "true"}, timeout=scaled(60))
    for done in (sidecar, oneshot):
        assert done.returncode == 1, done.stderr
        assert f"no process named {nobody} is there to signal" in done.stderr


def test_the_empty_fallback_links_dev_null_which_the_plugin_reads_as_the_empty_config(tmp_path: Path) -> None:
    with FakeApiServer({}) as server:
        env = config_manager_environment(
            tmp_path, server.url, ["a", "b"], FALLBACK_STRATEGIES="empty", ONESHOT="true"
        )
        done = _run({**env, "SEND_SIGNAL": "false"}, timeout=scaled(60))
    assert done.returncode == 0, done.stderr
    assert os.readlink(tmp_path / "config.yaml") == os.devnull
    assert read_config_document(tmp_path / "config.yaml") is None


def test_a_bad_label_in_oneshot_exits_1_as_nvidias(tmp_path: Path) -> None:
    """NVIDIA's start(): `if f.Oneshot || err != nil { return err }`, and main exits 1 on an error."""
    with FakeApiServer({LABEL: "typo"}) as server:
        done = _run(
            config_manager_environment(tmp_path, server.url, ["a"], ONESHOT="true", SEND_SIGNAL="false")
        )
    assert done.returncode == 1
    assert not (tmp_path / "config.yaml").is_symlink()


# ---- signalling: never itself, never a process it cannot identify ------------------------------------------


def test_neither_itself_nor_an_unreadable_process_is_found(tmp_path: Path) -> None:
    name = "nvdp-fake-name"  # under 15 bytes: identified by comm alone
    own = tmp_path / str(os.getpid())
    own.mkdir()
    (own / "comm").write_text(f"{name}\n")
    unreadable = tmp_path / "999999"  # no comm: cannot be identified, whatever its command line says
    unreadable.mkdir()
    (unreadable / "cmdline").write_bytes(f"/usr/bin/{name}\0run\0".encode())
    named = tmp_path / "999998"
    named.mkdir()
    (named / "comm").write_text(f"{name}\n")
    assert find_processes(name, proc_root=tmp_path) == [999998]


def test_only_a_link_to_dev_null_reads_as_the_empty_config(tmp_path: Path) -> None:
    zero = tmp_path / "zero.yaml"
    zero.symlink_to("/dev/zero")  # a device that never ends is still refused, link or not
    with pytest.raises(ConfigError, match="is a character device, not a regular config file"):
        read_config_document(zero)
    with pytest.raises(ConfigError, match="is a character device"):
        read_config_document(os.devnull)  # named itself: not config-manager's link

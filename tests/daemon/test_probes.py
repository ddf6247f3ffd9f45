"""The HTTP probe server on its own, over real TCP sockets: the bounds (pending heads, scrapes, probes,
each its own), the idle timeout and the header deadline, the render cache shared by concurrent scrapes,
and probes that fail without taking the server down.

The answers come from small callables standing in for the daemon (the server's whole interface to it);
what the daemon itself answers is tested in test_metrics.py.
"""

from __future__ import annotations

import http.client
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

import pytest

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.telemetry import probes
from nvidia_device_plugin.telemetry.probes import Check, ProbeServer, RenderMetrics, parse_address

from support.checks import assert_all
from support.threads import threads_named

# A bound on how long a client waits for anything, so a server that hangs fails the test instead of
# hanging it; every expected answer comes far sooner.
HANG_GUARD_S = 5.0
REQUEST = b"GET /healthz HTTP/1.1\r\nHost: probes\r\n\r\n"


def fine() -> str | None:
    return None


class CountingRender:
    """A /metrics renderer that counts its calls and, while `gate` is shut, blocks inside the render."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, accept: str) -> tuple[bytes, str]:
        with self._lock:
            self.calls += 1
            call = self.calls
        if not self.gate.wait(HANG_GUARD_S):
            raise RuntimeError("the test never opened the render gate")
        return f"# render {call} for {accept or 'no Accept'}\n".encode(), "text/plain; version=0.0.4"


@contextmanager
def serving(
    render: RenderMetrics | None = None, liveness: Check = fine, readiness: Check = fine, **bounds: float
) -> Iterator[ProbeServer]:
    """A started ProbeServer; `bounds` (render_cache_s, idle_timeout_s, header_deadline_s) as given."""
    server = ProbeServer("127.0.0.1:0", render or CountingRender(), liveness, readiness, **bounds)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def connect(server: ProbeServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=HANG_GUARD_S)


def send(sock: socket.socket, data: bytes) -> None:
    """Send a request; a server that already closed the connection makes the send fail, which is fine."""
    with suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(data)


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; a reset counts as a close."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def get(server: ProbeServer, path: str, accept: str = "", method: str = "GET") -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HANG_GUARD_S)
    try:
        connection.request(method, path, headers={"Accept": accept} if accept else {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def answers(server: ProbeServer, path: str = "/healthz") -> bool:
    """True when one request is served; False when the server closes it unanswered."""
    try:
        return get(server, path)[0] == 200
    except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
        return False


def eventually(predicate: Callable[[], bool], timeout: float = HANG_GUARD_S) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# ---- the address ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        (":9402", ("", 9402)),
        ("0.0.0.0:9402", ("0.0.0.0", 9402)),
        ("[::1]:0", ("::1", 0)),
        ("localhost:80", ("localhost", 80)),
    ],
)
def test_parse_address_accepts_host_port_forms(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["9402", ":", ":http", ":70000", "::1:9402", "host:-1"])
def test_parse_address_rejects_malformed_values_naming_the_flag(address: str) -> None:
    with pytest.raises(ConfigError, match="--metrics-address"):
        parse_address(address)


# ---- the bounds ----------------------------------------------------------------------------------


def test_idle_connections_past_the_pending_bound_push_out_the_oldest_and_a_probe_gets_in() -> None:
    with serving() as server:
        idle = [connect(server) for _ in range(probes.MAX_PENDING)]
        try:
            # One more: the connection that has waited longest for its own head goes, this one is served.
            assert answers(server)
            assert read_to_end(idle[0]) == b"", "the oldest idle connection must be closed unanswered"
            assert server.refused_connections == 1
            assert get(server, "/metrics")[0] == 200
        finally:
            for sock in idle:
                sock.close()


def test_slow_probes_hold_only_the_probe_bound_and_a_further_one_is_answered_503_at_once() -> None:
    release = threading.Event()
    inside = threading.Semaphore(0)

    def slow_liveness() -> str | None:
        inside.release()
        return None if release.wait(HANG_GUARD_S) else "the test never released the probe"

    with serving(liveness=slow_liveness) as server:
        results: list[int] = []
        clients = [
            threading.Thread(target=lambda: results.append(get(server, "/healthz")[0]))
            for _ in range(probes.MAX_PROBES)
        ]
        for client in clients:
            client.start()
        try:
            for _ in clients:  # every probe slot is taken by a request inside the probe
                assert inside.acquire(timeout=HANG_GUARD_S)
            status, body = get(server, "/healthz")
            assert status == 503 and body.startswith(b"busy: ")
            assert server.refused_connections == 1
            assert get(server, "/metrics")[0] == 200  # scrapes have their own bound
        finally:
            release.set()
            for client in clients:
                client.join()
        assert results == [200] * probes.MAX_PROBES
        assert eventually(lambda: answers(server))


def test_scrapes_that_hang_never_fail_the_probes() -> None:
    # Issue 23 item 7: scrapes in flight held every connection slot, and /healthz failed.
    render = CountingRender()
    render.gate.clear()  # every scrape hangs inside the render until the test opens the gate
    with serving(render) as server:
        scrapers = [connect(server) for _ in range(probes.MAX_SCRAPES)]
        try:
            for sock in scrapers:
                sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            # Every scrape holds its slot (one renders, the others wait for its result) before the next.
            assert eventually(lambda: server.scrapes_answering == probes.MAX_SCRAPES)
            assert render.calls == 1
            status, body = get(server, "/metrics")
            assert status == 503 and body.startswith(b"busy: ")
            assert get(server, "/healthz") == (200, b"ok\n")
            assert get(server, "/readyz") == (200, b"ok\n")
        finally:
            render.gate.set()
            answers_ = [read_to_end(sock) for sock in scrapers]
            for sock in scrapers:
                sock.close()
        assert_all(answers_, lambda a: a.startswith(b"HTTP/1.0 200 "), [a[:20] for a in answers_])


def test_slow_header_senders_never_fail_the_probes() -> None:
    # Issue 23 item 7: 16 clients each sending one header byte every few seconds made every probe fail.
    with serving() as server:
        slow = [connect(server) for _ in range(probes.MAX_SCRAPES)]
        try:
            for sock in slow:
                sock.sendall(b"G")
            for _ in range(3):
                assert get(server, "/healthz") == (200, b"ok\n")
            assert get(server, "/metrics")[0] == 200
        finally:
            for sock in slow:
                sock.close()


# ---- the idle timeout and the header deadline ------------------------------------------------------


def test_a_client_that_sends_nothing_or_half_a_request_is_dropped_and_its_slot_freed() -> None:
    with serving(idle_timeout_s=0.2) as server:
        with connect(server) as silent, connect(server) as halfway:
            halfway.sendall(b"GET /metrics HTTP/1.1\r\nHost: probes\r\n")  # no blank line: headers never end
            assert read_to_end(silent) == b""
            assert read_to_end(halfway) == b""

        # A full house of silent clients only blocks the server until they time out.
        silent_ones = [connect(server) for _ in range(probes.MAX_PENDING)]
        try:
            for sock in silent_ones:
                assert read_to_end(sock) == b""
            assert answers(server)
        finally:
            for sock in silent_ones:
                sock.close()


def test_a_client_trickling_its_head_is_dropped_at_the_header_deadline() -> None:
    # Each byte comes well within the idle timeout; the head as a whole never comes in time.
    with serving(header_deadline_s=0.3) as server, connect(server) as trickle:
        done = threading.Event()

        def send_slowly() -> None:
            for byte in b"GET /healthz HTTP/1.1\r\nHost: probes\r\nX-Padding: " + b"a" * 10_000:
                if done.wait(0.02):
                    return
                try:
                    trickle.send(bytes([byte]))
                except OSError:
                    return

        sender = threading.Thread(target=send_slowly, daemon=True)
        sender.start()
        try:
            assert read_to_end(trickle) == b"", "a trickled head must be cut off unanswered"
        finally:
            done.set()
            sender.join()
        assert answers(server)


def test_a_head_over_the_size_bound_is_dropped() -> None:
    with serving() as server, connect(server) as big:
        send(big, b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * (2 * probes.MAX_HEAD_BYTES))
        assert read_to_end(big) == b""
        assert answers(server)


# ---- the render cache ----------------------------------------------------------------------------


def test_concurrent_scrapes_share_one_render() -> None:
    render = CountingRender()
    render.gate.clear()  # the first render waits until every scrape has been sent
    with serving(render, render_cache_s=60.0) as server:  # a window no slow machine can outlast
        scrapers = [connect(server) for _ in range(8)]
        try:
            for sock in scrapers:
                sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            render.gate.set()
            bodies = {read_to_end(sock).partition(b"\r\n\r\n")[2] for sock in scrapers}
        finally:
            for sock in scrapers:
                sock.close()
        assert render.calls == 1
        assert bodies == {b"# render 1 for no Accept\n"}

        # The cache is per Accept header: an OpenMetrics scraper gets its own render.
        status, body = get(server, "/metrics", accept="application/openmetrics-text")
        assert status == 200
        assert body == b"# render 2 for application/openmetrics-text\n"
        assert render.calls == 2


def test_without_a_cache_window_every_scrape_renders() -> None:
    render = CountingRender()
    with serving(render, render_cache_s=0.0) as server:
        bodies = [get(server, "/metrics")[1] for _ in range(3)]
    assert render.calls == 3
    assert bodies == [f"# render {n} for no Accept\n".encode() for n in (1, 2, 3)]


def test_head_answers_the_headers_of_get_without_a_body() -> None:
    with serving() as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=HANG_GUARD_S)
        try:
            connection.request("HEAD", "/metrics")
            response = connection.getresponse()
            assert response.status == 200
            assert response.getheader("Content-Type") == "text/plain; version=0.0.4"
            assert int(response.getheader("Content-Length") or 0) == len(b"# render 1 for no Accept\n")
            assert response.read() == b""
        finally:
            connection.close()


# ---- failing callables ---------------------------------------------------------------------------


def test_a_probe_that_raises_answers_503_and_the_server_keeps_serving() -> None:
    def broken_readiness() -> str | None:
        raise RuntimeError("registrar state unreadable")

    with serving(readiness=broken_readiness) as server:
        assert get(server, "/readyz") == (503, b"probe failed: registrar state unreadable\n")
        assert get(server, "/healthz") == (200, b"ok\n")
        assert get(server, "/metrics")[0] == 200
        assert get(server, "/readyz")[0] == 503


def test_a_probe_that_reports_a_reason_answers_503_with_it() -> None:
    with serving(liveness=lambda: "health monitor thread died") as server:
        assert get(server, "/healthz") == (503, b"health monitor thread died\n")
        assert get(server, "/readyz") == (200, b"ok\n")


def test_a_render_that_raises_answers_500_and_the_next_scrape_renders_again() -> None:
    failures = [RuntimeError("collector broke")]

    def render(accept: str) -> tuple[bytes, str]:
        if failures:
            raise failures.pop()
        return b"# fine\n", "text/plain; version=0.0.4"

    with serving(render, render_cache_s=60.0) as server:  # a failure must not be cached as an answer
        status, body = get(server, "/metrics")
        assert status == 500
        assert b"see the plugin log" in body
        assert get(server, "/metrics") == (200, b"# fine\n")


def test_a_scraper_that_hangs_up_before_its_answer_costs_a_debug_line_not_a_traceback(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=probes.__name__)
    render = CountingRender()
    render.gate.clear()  # the render waits, so the client is gone when the answer is written
    with serving(render) as server:
        sock = connect(server)
        send(sock, b"GET /metrics HTTP/1.1\r\nHost: probes\r\n\r\n")
        assert eventually(lambda: render.calls == 1)
        # Closed with a reset (linger 0): the server's write of the answer fails, as after a scrape timeout.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        render.gate.set()
        assert eventually(lambda: "hung up before its answer was written" in caplog.text), caplog.text
        assert get(server, "/metrics")[0] == 200  # and it goes on serving
    assert "Traceback" not in capsys.readouterr().err


# ---- lifecycle -----------------------------------------------------------------------------------


def test_stop_joins_the_thread_closes_the_port_and_can_be_repeated() -> None:
    server = ProbeServer("127.0.0.1:0", CountingRender(), fine, fine)
    server.start()
    port = server.port
    assert threads_named("probes-http")
    server.stop()
    server.stop()
    assert not threads_named("probes-http")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S).close()

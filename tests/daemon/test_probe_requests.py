"""The HTTP server reads a request as docs/operations.md "Limits" says (issue 32, the smaller items): a
request head of at most MAX_HEAD_BYTES (16 KiB; up to 20 KiB got through), and one path for the bounds and
the answers (`//healthz` held a scrape slot, and was never answered as a probe)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pytest

from nvidia_device_plugin.telemetry import probes
from nvidia_device_plugin.telemetry.probes import ProbeServer, request_path

from support.waiting import wait_for

HANG_GUARD_S = 5.0


class _HeldRender:
    """A /metrics render that waits inside until `gate` opens (scrapes hold their slots meanwhile)."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def __call__(self, accept: str) -> tuple[bytes, str]:
        if not self.gate.wait(HANG_GUARD_S):
            raise RuntimeError("the test never opened the render gate")
        return b"# metrics\n", "text/plain; version=0.0.4"


@contextmanager
def serving(render: _HeldRender) -> Iterator[ProbeServer]:
    server = ProbeServer("127.0.0.1:0", render, lambda: None, lambda: None)
    server.start()
    try:
        yield server
    finally:
        render.gate.set()
        server.stop()


def exchange(server: ProbeServer, request: bytes) -> bytes:
    """Send `request`, read until the server closes; b"" when it closes unanswered."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=HANG_GUARD_S) as sock:
        with suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        data = b""
        with suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                data += chunk
        return data


def head_of(size: int, path: str = "/healthz") -> bytes:
    """A GET request head of exactly `size` bytes, blank line included."""
    start, end = f"GET {path} HTTP/1.0\r\nX-Pad: ".encode(), b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end


def test_a_request_head_of_16_kib_is_answered_and_one_byte_more_is_not() -> None:
    render = _HeldRender()
    render.gate.set()
    with serving(render) as server:
        assert exchange(server, head_of(probes.MAX_HEAD_BYTES)).startswith(b"HTTP/1.0 200 ")
        assert exchange(server, head_of(probes.MAX_HEAD_BYTES + 1)) == b""
        assert exchange(server, head_of(probes.MAX_HEAD_BYTES + 3 * 1024)) == b""  # was answered
    assert probes.MAX_HEAD_BYTES == 16 * 1024  # the figure docs/operations.md "Limits" gives


def test_request_paths_are_normalised() -> None:
    assert [request_path(t) for t in ("//healthz", "/healthz?x=1", "///readyz#a", "http://h:1//metrics")] == [
        "/healthz",
        "/healthz",
        "/readyz",
        "/metrics",
    ]


def test_a_probe_path_with_doubled_slashes_is_a_probe_in_its_bound_and_its_answer() -> None:
    render = _HeldRender()  # shut: every scrape holds its slot
    with serving(render) as server:
        scrapers = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(probes.MAX_SCRAPES)]
        try:
            for sock in scrapers:
                sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            wait_for(lambda: server.scrapes_answering == probes.MAX_SCRAPES, "every scrape slot taken")
            busy = exchange(server, b"GET /metrics HTTP/1.0\r\n\r\n")
            assert busy.startswith(b"HTTP/1.0 503 ")
            for target in ("//healthz", "//readyz", "/healthz?verbose"):
                answer = exchange(server, f"GET {target} HTTP/1.0\r\n\r\n".encode())
                assert answer.startswith(b"HTTP/1.0 200 ") and answer.endswith(b"\r\n\r\nok\n"), (
                    target,
                    answer,
                )
        finally:
            render.gate.set()
            for sock in scrapers:
                sock.close()


def test_scrape_answers_are_spaced_whatever_the_scrapers_do() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    renders: list[str] = []

    def render(accept: str) -> tuple[bytes, str]:
        renders.append(accept)
        return b"# metrics\n", "text/plain; version=0.0.4"

    cache = probes._RenderCache(render, str, 60.0, probes.SCRAPE_SPACING_S, clock=lambda: now[0], sleep=sleep)
    for _ in range(10):  # scrapers in a loop: each answer waits for the one before's spacing
        cache.get("")
    assert slept == [pytest.approx(probes.SCRAPE_SPACING_S)] * 9 and len(renders) == 1
    now[0] += 60.0  # a scrape after a quiet spell (Prometheus, every 15-30 s) is answered at once
    cache.get("")
    assert len(slept) == 9
    assert 1 / probes.SCRAPE_SPACING_S == 50  # the figure docs/operations.md "Limits" gives

"""The daemon's HTTP endpoints: /metrics for Prometheus, /healthz (liveness) and /readyz (readiness).

The server is small on purpose and bounded, so nothing a scraper or a stray client does can reach the
kubelet-facing path:

* at most MAX_CONNECTIONS connections are served at once; further ones are closed at once (a scraper
  retries on its next interval, and an idle connection cannot pin a thread and a descriptor forever);
* a connection that sends nothing for IDLE_TIMEOUT_S seconds is closed;
* a /metrics body is rendered at most once per RENDER_CACHE_S seconds and shared by every scrape in
  that window, so eight scrapers cost what one does.

The answers come from callables handed in by the daemon, so this module knows nothing about GPUs.
"""

from __future__ import annotations

import http.server
import logging
import socket
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from nvidia_device_plugin import __version__
from nvidia_device_plugin.errors import ConfigError, DevicePluginError
from nvidia_device_plugin.workers import Worker

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 16
IDLE_TIMEOUT_S = 10.0
RENDER_CACHE_S = 1.0
# serve_forever() notices shutdown() only between polls: this bounds how long stop() waits.
_SHUTDOWN_POLL_S = 0.1

RenderMetrics = Callable[[str], tuple[bytes, str]]  # Accept header -> (body, content type)
Check = Callable[[], str | None]  # None when fine, else the reason (the 503 body)


def parse_address(address: str) -> tuple[str, int]:
    """ "host:port", ":port" or "[v6]:port" -> (host, port); host "" means every IPv4 interface."""
    host, sep, port_text = address.strip().rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(
            f"--metrics-address must be host:port or :port (port 0-65535), got {address!r}; "
            "an empty value disables the metrics server"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"--metrics-address {address!r}: write an IPv6 host in brackets, e.g. [::]:9402")
    return host, int(port_text)


class _RenderCache:
    """One render per window, shared by concurrent scrapes (the lock makes latecomers wait for it)."""

    def __init__(self, render: RenderMetrics, ttl_s: float) -> None:
        self._render = render
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cached: dict[str, tuple[float, bytes, str]] = {}

    def get(self, accept: str) -> tuple[bytes, str]:
        with self._lock:
            now = time.monotonic()
            hit = self._cached.get(accept)
            if hit is not None and now - hit[0] < self._ttl_s:
                return hit[1], hit[2]
            body, content_type = self._render(accept)
            if len(self._cached) > 8:  # Accept headers are client-chosen: keep the cache bounded
                self._cached.clear()
            self._cached[accept] = (now, body, content_type)
            return body, content_type


def _handler_class(
    metrics: _RenderCache, liveness: Check, readiness: Check
) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = f"nvidia-device-plugin/{__version__}"
        timeout = IDLE_TIMEOUT_S  # socket timeout: an idle or slow client is dropped

        def do_GET(self) -> None:
            self._answer(send_body=True)

        def do_HEAD(self) -> None:
            self._answer(send_body=False)

        def _answer(self, send_body: bool) -> None:
            path = urlsplit(self.path).path
            if path == "/metrics":
                try:
                    body, content_type = metrics.get(self.headers.get("Accept", ""))
                except Exception:
                    log.exception("metrics: collecting failed")
                    self._send(
                        500, b"collecting metrics failed; see the plugin log\n", "text/plain", send_body
                    )
                    return
                self._send(200, body, content_type, send_body)
            elif path in ("/healthz", "/readyz"):
                check = liveness if path == "/healthz" else readiness
                try:
                    reason = check()
                except Exception as exc:  # a probe that cannot tell says so; it never kills the server
                    log.exception("probe %s failed", path)
                    reason = f"probe failed: {exc}"
                if reason is None:
                    self._send(200, b"ok\n", "text/plain; charset=utf-8", send_body)
                else:
                    self._send(503, f"{reason}\n".encode(), "text/plain; charset=utf-8", send_body)
            else:
                self._send(404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain", send_body)

        def _send(self, status: int, body: bytes, content_type: str, send_body: bool) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if send_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            # Probes hit this server every few seconds; a line per request would drown the state changes.
            log.debug("http: " + format, *args)

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True  # a hung client must not keep the process alive at exit
    block_on_close = False
    # listen() backlog. socketserver's default of 5 makes the kernel drop the SYNs of a burst of connects,
    # which the clients retry a second or more later; with room in the backlog, connections past
    # MAX_CONNECTIONS are accepted and closed at once instead, as the module docstring promises.
    request_queue_size = 4 * MAX_CONNECTIONS

    def __init__(self, address: tuple[str, int], handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refused = 0
        super().__init__(address, handler)

    def process_request(self, request: socket.socket | tuple[bytes, socket.socket], client: object) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        super().process_request(request, client)

    def process_request_thread(
        self, request: socket.socket | tuple[bytes, socket.socket], client: object
    ) -> None:
        try:
            super().process_request_thread(request, client)
        finally:
            self._slots.release()


class _Server6(_Server):
    address_family = socket.AF_INET6


class ProbeServer(Worker):
    """The HTTP server: start() binds, then serves on its thread ("probes-http"); stop() shuts it down."""

    def __init__(
        self, address: str, render_metrics: RenderMetrics, liveness: Check, readiness: Check
    ) -> None:
        super().__init__("probes-http")
        self.address = address
        self._handler = _handler_class(_RenderCache(render_metrics, RENDER_CACHE_S), liveness, readiness)
        self._server: _Server | None = None
        self.host = ""
        self.port = 0

    def setup(self) -> bool:
        """Bind; ConfigError for a malformed address, DevicePluginError when it cannot bind."""
        host, port = parse_address(self.address)
        server_class = _Server6 if ":" in host else _Server
        try:
            self._server = server_class((host, port), self._handler)
        except OSError as exc:
            raise DevicePluginError(
                f"cannot serve metrics on --metrics-address {self.address!r}: {exc.strerror or exc}"
            ) from None
        bound_host, bound_port = self._server.server_address[:2]
        self.host, self.port = str(bound_host), int(bound_port)
        log.info("http: serving /metrics, /healthz and /readyz on %s:%d", self.host, self.port)
        return True

    def run(self, stop: threading.Event) -> None:
        if self._server is not None:
            self._server.serve_forever(_SHUTDOWN_POLL_S)

    def wake(self) -> None:
        server = self._server
        if server is not None and self.started:
            server.shutdown()  # returns once serve_forever has; at most one poll interval

    def cleanup(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.server_close()
            log.info("http: stopped")

    @property
    def refused_connections(self) -> int:
        server = self._server
        return server.refused if server is not None else 0

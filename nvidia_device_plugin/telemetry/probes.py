"""The daemon's HTTP endpoints: /metrics for Prometheus, /healthz (liveness) and /readyz (readiness).

The server is small on purpose and bounded, so nothing a scraper or a stray client does can reach the
kubelet-facing path, and nothing a client of /metrics does can fail the probes:

* a connection first has HEADER_DEADLINE_S seconds to send its whole request head (at most
  MAX_HEAD_BYTES); a slow one (a header byte every few seconds) is closed when the deadline passes;
* at most MAX_PENDING connections wait for their head at once: a further one pushes out the one that has
  waited longest, so a kubelet probe (which sends its request at once) always gets its turn;
* once the path is known, /metrics and the probes have bounds of their own: MAX_SCRAPES scrapes and
  MAX_PROBES probes answered at once; past them the request is answered 503 at once. A scrape that hangs
  in the render or in a client that never reads can hold only scrape slots;
* a connection silent for IDLE_TIMEOUT_S seconds (reading or writing) is closed;
* a /metrics body is rendered at most once per RENDER_CACHE_S seconds per exposition format (the Accept
  header is reduced to the formats that exist first, by `negotiate`) and shared by every scrape in that
  window, so eight scrapers cost what one does, however they word their Accept headers; and /metrics
  answers are spaced SCRAPE_SPACING_S apart, all scrapers together.

The answers come from callables handed in by the daemon, so this module knows nothing about GPUs.
"""

from __future__ import annotations

import collections
import contextlib
import http.server
import io
import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from nvidia_device_plugin import __version__
from nvidia_device_plugin.base.errors import ConfigError, DevicePluginError
from nvidia_device_plugin.base.workers import Worker

log = logging.getLogger(__name__)

MAX_SCRAPES = 16  # /metrics requests answered at once
MAX_PROBES = 8  # /healthz and /readyz requests answered at once (kubelet sends one per probe)
MAX_PENDING = 64  # connections whose request head has not arrived yet
HEADER_DEADLINE_S = 5.0  # for the whole request head (Prometheus and kubelet send it at once)
MAX_HEAD_BYTES = 16 * 1024
IDLE_TIMEOUT_S = 10.0
RENDER_CACHE_S = 1.0
# /metrics answers, all scrapers together, at most one per SCRAPE_SPACING_S (50 a second; Prometheus
# scrapes every 15-30 s): each answer costs the request's parse and a thread however cheap the body is,
# and scrapers in a loop must not take the CPU Allocate needs.
SCRAPE_SPACING_S = 0.02
_MAX_FORMATS = 16  # cached renders (negotiate leaves about a dozen formats)
# serve_forever() notices shutdown() only between polls: this bounds how long stop() waits.
_SHUTDOWN_POLL_S = 0.1
_PROBE_PATHS = ("/healthz", "/readyz")
_SCRAPES_BOUND, _PROBES_BOUND = f"{MAX_SCRAPES} scrapes", f"{MAX_PROBES} probes"  # named in 503 answers
_SLOTS = {_SCRAPES_BOUND: MAX_SCRAPES, _PROBES_BOUND: MAX_PROBES}

RenderMetrics = Callable[[str], tuple[bytes, str]]  # Accept header -> (body, content type)
Negotiate = Callable[[str], str]  # Accept header -> the format it asks for, as an Accept header
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
    """One render per window and format, shared by concurrent scrapes (latecomers wait for it); answers
    spaced `spacing_s` apart (a scraper in a loop waits its turn, holding its slot, never the CPU)."""

    def __init__(
        self,
        render: RenderMetrics,
        negotiate: Negotiate,
        ttl_s: float,
        spacing_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._render = render
        self._negotiate = negotiate
        self._ttl_s = ttl_s
        self._spacing_s = spacing_s
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._pace = threading.Lock()
        self._next_answer = 0.0
        self._cached: dict[str, tuple[float, bytes, str]] = {}

    def get(self, accept: str) -> tuple[bytes, str]:
        with self._pace:
            wait = self._next_answer - self._clock()
            if wait > 0:
                self._sleep(wait)
            self._next_answer = self._clock() + self._spacing_s
        wanted = self._negotiate(accept)
        with self._lock:
            now = time.monotonic()
            hit = self._cached.get(wanted)
            if hit is not None and now - hit[0] < self._ttl_s:
                return hit[1], hit[2]
            body, content_type = self._render(wanted)
            if len(self._cached) >= _MAX_FORMATS:  # whatever negotiate lets through, the cache stays bounded
                self._cached.clear()
            self._cached[wanted] = (now, body, content_type)
            return body, content_type


def read_head(sock: socket.socket, deadline: float, idle_timeout_s: float = IDLE_TIMEOUT_S) -> bytes | None:
    """The request head (up to its blank line), or None when the client is too slow, too big or gone."""
    head = b""
    while b"\r\n\r\n" not in head and b"\n\n" not in head:
        left = deadline - time.monotonic()
        if left <= 0 or len(head) >= MAX_HEAD_BYTES:
            return None
        sock.settimeout(min(left, idle_timeout_s))
        try:
            chunk = sock.recv(min(4096, MAX_HEAD_BYTES - len(head)))  # never past the bound
        except OSError:  # a timeout, a reset, or pushed out by newer connections
            return None
        if not chunk:
            return None
        head += chunk
    sock.settimeout(idle_timeout_s)
    return head


def _path_of(head: bytes) -> str:
    parts = head.split(b"\r\n", 1)[0].split(b"\n", 1)[0].split()
    return request_path(parts[1].decode("latin-1")) if len(parts) >= 2 else ""


def request_path(target: str) -> str:
    """The path of a request target, as the bounds and the answers both see it: no query, and `//healthz`
    is `/healthz` (urlsplit would read `//healthz` as a host with an empty path)."""
    path = target.split("?", 1)[0].split("#", 1)[0] if target.startswith("/") else urlsplit(target).path
    return re.sub("/{2,}", "/", path)


class _Handler(http.server.BaseHTTPRequestHandler):
    """One connection: its head read under the deadline, then one request answered within its bound."""

    metrics: _RenderCache  # set by _handler_class, with the three below
    checks: dict[str, Check]
    header_deadline_s: float
    idle_timeout_s: float
    server_version = f"nvidia-device-plugin/{__version__}"
    busy: str | None = None  # why this request is answered 503 at once (its bound is full)

    def handle(self) -> None:
        server = self.server
        assert isinstance(server, _Server)
        head = read_head(self.connection, time.monotonic() + self.header_deadline_s, self.idle_timeout_s)
        server.head_read(self.connection)
        if head is None:
            log.debug("http: a client sent no complete request head in time; closed")
            return
        self.rfile = io.BytesIO(head)  # GET and HEAD carry no body; one request per connection
        what = server.bound_of(_path_of(head))
        if not server.take_slot(what):
            self.busy = f"busy: {what} already being answered; try again\n"
            self.handle_one_request()
            return
        try:
            self.handle_one_request()
        finally:
            server.give_slot(what)

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def _answer(self, send_body: bool) -> None:
        path = request_path(self.path)
        if self.busy is not None:
            self._send(503, self.busy.encode(), "text/plain; charset=utf-8", send_body)
        elif path == "/metrics":
            try:
                body, content_type = self.metrics.get(self.headers.get("Accept", ""))
            except Exception:
                log.exception("metrics: collecting failed")
                self._send(500, b"collecting metrics failed; see the plugin log\n", "text/plain", send_body)
                return
            self._send(200, body, content_type, send_body)
        elif path in self.checks:
            self._probe(self.checks[path], path, send_body)
        else:
            self._send(404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain", send_body)

    def _probe(self, check: Check, path: str, send_body: bool) -> None:
        try:
            reason = check()
        except Exception as exc:  # a probe that cannot tell says so; it never kills the server
            log.exception("probe %s failed", path)
            reason = f"probe failed: {exc}"
        if reason is None:
            self._send(200, b"ok\n", "text/plain; charset=utf-8", send_body)
        else:
            self._send(503, f"{reason}\n".encode(), "text/plain; charset=utf-8", send_body)

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


def _handler_class(
    metrics: _RenderCache, liveness: Check, readiness: Check, idle_timeout_s: float, header_deadline_s: float
) -> type[_Handler]:
    class Handler(_Handler):
        timeout = idle_timeout_s  # the socket timeout: idle clients go

    Handler.metrics = metrics
    Handler.checks = {"/healthz": liveness, "/readyz": readiness}
    Handler.header_deadline_s, Handler.idle_timeout_s = header_deadline_s, idle_timeout_s
    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True  # a hung client must not keep the process alive at exit
    block_on_close = False
    # listen() backlog. socketserver's default of 5 makes the kernel drop the SYNs of a burst of connects,
    # which the clients retry a second or more later; with room in the backlog, every connection is
    # accepted at once and the bounds above decide.
    request_queue_size = 4 * MAX_PENDING

    def __init__(self, address: tuple[str, int], handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self.lock = threading.Lock()
        # Connections still sending their head, oldest first (by id: a socket is not hashable by value).
        self._pending: collections.OrderedDict[int, socket.socket] = collections.OrderedDict()
        self.refused = 0
        self.answering = collections.Counter[str]()  # requests holding a slot, by bound (_SLOTS)
        super().__init__(address, handler)

    @staticmethod
    def bound_of(path: str) -> str:
        return _PROBES_BOUND if path in _PROBE_PATHS else _SCRAPES_BOUND

    def take_slot(self, bound: str) -> bool:
        """One of `bound`'s slots for a request; False (counted as refused) when all are taken."""
        with self.lock:
            if self.answering[bound] >= _SLOTS[bound]:
                self.refused += 1
                return False
            self.answering[bound] += 1
            return True

    def give_slot(self, bound: str) -> None:
        with self.lock:
            self.answering[bound] -= 1

    def process_request(self, request: socket.socket | tuple[bytes, socket.socket], client: object) -> None:
        assert isinstance(request, socket.socket)
        with self.lock:
            self._pending[id(request)] = request
            oldest = self._pending.popitem(last=False)[1] if len(self._pending) > MAX_PENDING else None
            if oldest is not None:
                self.refused += 1
        if oldest is not None:
            # The connection that waited longest for its own head goes: a fresh probe always gets in.
            with contextlib.suppress(OSError):
                oldest.shutdown(socket.SHUT_RDWR)
        super().process_request(request, client)

    def head_read(self, sock: socket.socket) -> None:
        """`sock` no longer waits for its head (it came, or it never will)."""
        with self.lock:
            self._pending.pop(id(sock), None)

    def process_request_thread(
        self, request: socket.socket | tuple[bytes, socket.socket], client: object
    ) -> None:
        try:
            super().process_request_thread(request, client)
        finally:
            if isinstance(request, socket.socket):
                self.head_read(request)

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket], client: object) -> None:
        """socketserver's own prints a traceback to stderr, outside the log and its format. A client that
        hung up before its answer was written (a probe's timeout, a scraper's) is routine; anything else is
        logged once, with the traceback, through the plugin's log."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):
            log.debug("http: the client %s hung up before its answer was written (%s)", client, error)
        else:
            log.error("http: answering %s failed", client, exc_info=error)


class _Server6(_Server):
    address_family = socket.AF_INET6


class ProbeServer(Worker):
    """The HTTP server: start() binds, then serves on its thread ("probes-http"); stop() shuts it down.

    The bounds of the module's docstring are parameters with those defaults (tests shorten or lengthen them).
    """

    def __init__(
        self,
        address: str,
        render_metrics: RenderMetrics,
        liveness: Check,
        readiness: Check,
        negotiate: Negotiate = str,
        *,
        render_cache_s: float = RENDER_CACHE_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        header_deadline_s: float = HEADER_DEADLINE_S,
    ) -> None:
        super().__init__("probes-http")
        self.address = address
        cache = _RenderCache(render_metrics, negotiate, render_cache_s, SCRAPE_SPACING_S)
        self._handler = _handler_class(cache, liveness, readiness, idle_timeout_s, header_deadline_s)
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

    @property
    def scrapes_answering(self) -> int:
        """/metrics requests holding one of the MAX_SCRAPES slots now."""
        server = self._server
        if server is None:
            return 0
        with server.lock:
            return server.answering[_SCRAPES_BOUND]

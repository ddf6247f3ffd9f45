"""Prometheus metrics, /healthz and /readyz on one small HTTP server.

What the daemon advertises (devices per resource and health, GPUs, replicas, unhealthy devices and why) is
computed at scrape time from the daemon's snapshot and health registry, so it can never drift from what
kubelet sees. What happens (Allocate calls, XIDs, registrations, kubelet restarts, reloads) is counted by
hooks appended to the daemon's listener lists; the hooks run on gRPC and health threads and only bump
counters.

Every metric lives in a private CollectorRegistry, so tests and several daemons in one process never share
counters. Names follow Prometheus conventions: prefix `nvidia_device_plugin_`, `_total` for counters,
`_seconds` for durations. docs/metrics.md lists every metric.
"""

from __future__ import annotations

import http.server
import logging
import platform
import socket
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Sequence
from typing import Literal, Protocol, TypeVar
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter, Histogram, Info
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from nvidia_device_plugin import __version__
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.errors import ConfigError, DevicePluginError
from nvidia_device_plugin.events import CallError, Events, HealthChange
from nvidia_device_plugin.health_state import HealthRegistry
from nvidia_device_plugin.plugin.manager import PluginManager
from nvidia_device_plugin.resources import ResourcePlan

log = logging.getLogger(__name__)

T = TypeVar("T")

PREFIX = "nvidia_device_plugin_"
# Allocate answers in well under a millisecond on a healthy node; a slow one (NVML calls, a busy node)
# takes tens of milliseconds, and kubelet gives up after its own timeout, so nothing past a second matters.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
ERROR_CODES = ("invalid_argument", "internal")
# serve_forever() notices shutdown() only between polls: this bounds how long stop() waits (and costs ten
# idle wake-ups a second).
_SHUTDOWN_POLL_SECONDS = 0.1


class SnapshotView(Protocol):
    """What metrics read from the daemon's current snapshot."""

    @property
    def inventory(self) -> Inventory: ...

    @property
    def plans(self) -> Sequence[ResourcePlan]: ...


class DaemonView(Protocol):
    """The daemon attributes metrics depend on, and nothing else (see daemon.Daemon)."""

    @property
    def snapshot(self) -> SnapshotView | None: ...

    @property
    def registry(self) -> HealthRegistry: ...

    @property
    def manager(self) -> PluginManager: ...

    @property
    def reload_listeners(self) -> list[Callable[[bool, str], None]]: ...

    @property
    def xid_listeners(self) -> list[Callable[[str, int, bool], None]]: ...


# ---- address ---------------------------------------------------------------------------------------


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


# ---- metrics ---------------------------------------------------------------------------------------


class _Events(Events):
    """Counters and histograms fed by the daemon's hooks."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.allocations = Counter(
            PREFIX + "allocations",
            "Allocate calls answered successfully, by resource.",
            ["resource"],
            registry=registry,
        )
        self.allocate_errors = Counter(
            PREFIX + "allocate_errors",
            "Allocate calls refused (invalid_argument) or failed (internal), by resource.",
            ["resource", "code"],
            registry=registry,
        )
        self.allocate_seconds = Histogram(
            PREFIX + "allocate_duration_seconds",
            "Time to answer an Allocate call, successful or not, by resource.",
            ["resource"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.preferred_errors = Counter(
            PREFIX + "preferred_allocation_errors",
            "GetPreferredAllocation calls refused (invalid_argument) or failed (internal), by resource.",
            ["resource", "code"],
            registry=registry,
        )
        self.preferred_seconds = Histogram(
            PREFIX + "preferred_allocation_duration_seconds",
            "Time to answer a GetPreferredAllocation call, successful or not, by resource.",
            ["resource"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.xids = Counter(
            PREFIX + "xid_events",
            "XID events from NVML, by GPU and XID; critical=true when the event made a device unhealthy.",
            ["gpu_uuid", "xid", "critical"],
            registry=registry,
        )
        self.health_changes = Counter(
            PREFIX + "device_health_changes",
            "Physical devices (GPU or MIG) that turned unhealthy or healthy again.",
            ["health"],
            registry=registry,
        )
        self.registrations = Counter(
            PREFIX + "registrations",
            "Successful registrations with kubelet, by resource (one per start, kubelet restart or rebind).",
            ["resource"],
            registry=registry,
        )
        self.kubelet_restarts = Counter(
            PREFIX + "kubelet_restarts",
            "Times kubelet re-created its registration socket (a kubelet restart).",
            registry=registry,
        )
        self.reloads = Counter(
            PREFIX + "config_reloads",
            "Config reloads, by result: applied, or rejected (the previous config keeps being served).",
            ["result"],
            registry=registry,
        )
        for health in ("healthy", "unhealthy"):
            self.health_changes.labels(health)
        for result in ("applied", "rejected"):
            self.reloads.labels(result)

    def touch_resource(self, resource: str) -> None:
        """Make a resource's counters appear at 0, so rate() and absent() work from its first scrape."""
        self.allocations.labels(resource)
        self.allocate_seconds.labels(resource)
        self.preferred_seconds.labels(resource)
        for code in ERROR_CODES:
            self.allocate_errors.labels(resource, code)
            self.preferred_errors.labels(resource, code)

    # Hooks: called on gRPC, registrar and health threads; each only updates counters.

    def call_answered(
        self,
        resource: str,
        method: Literal["Allocate", "GetPreferredAllocation"],
        seconds: float,
        error: CallError | None,
    ) -> None:
        (self.on_allocate if method == "Allocate" else self.on_preferred)(resource, seconds, error)

    def registered(self, resource: str) -> None:
        self.on_registered(resource)

    def kubelet_restarted(self) -> None:
        self.on_kubelet_restart()

    def on_allocate(self, resource: str, seconds: float, error: str | None) -> None:
        self.allocate_seconds.labels(resource).observe(seconds)
        if error is None:
            self.allocations.labels(resource).inc()
        else:
            self.allocate_errors.labels(resource, error).inc()

    def on_preferred(self, resource: str, seconds: float, error: str | None) -> None:
        self.preferred_seconds.labels(resource).observe(seconds)
        if error is not None:
            self.preferred_errors.labels(resource, error).inc()

    def on_registered(self, resource: str) -> None:
        self.touch_resource(resource)
        self.registrations.labels(resource).inc()

    def on_kubelet_restart(self) -> None:
        self.kubelet_restarts.inc()

    def on_reload(self, applied: bool, error: str) -> None:
        self.reloads.labels("applied" if applied else "rejected").inc()

    def on_xid(self, gpu_uuid: str, xid: int, critical: bool) -> None:
        self.xids.labels(gpu_uuid, str(xid), "true" if critical else "false").inc()

    def on_health_change(self, change: HealthChange) -> None:
        self.health_changes.labels("healthy" if change.healthy else "unhealthy").inc()


class _StateCollector(Collector):
    """Gauges computed from the daemon's snapshot, health registry and plugin manager at each scrape."""

    def __init__(self, daemon: DaemonView) -> None:
        self._daemon = daemon

    def collect(self) -> Iterable[Metric]:
        daemon = self._daemon
        snapshot = daemon.snapshot
        plans: Sequence[ResourcePlan] = snapshot.plans if snapshot is not None else ()
        health = daemon.registry

        devices = GaugeMetricFamily(
            PREFIX + "devices",
            "Device IDs advertised to kubelet (replicas count one each), by resource and health.",
            labels=["resource", "health"],
        )
        replicas = GaugeMetricFamily(
            PREFIX + "replicas",
            "Device IDs a shared resource advertises on one physical GPU (replicas x its devices there).",
            labels=["resource", "gpu_uuid"],
        )
        for plan in plans:
            healthy = sum(1 for dev in plan.devices if health.is_healthy(dev))
            devices.add_metric([plan.name, "healthy"], healthy)
            devices.add_metric([plan.name, "unhealthy"], len(plan.devices) - healthy)
            if plan.sharing != "none":
                per_gpu = Tally(dev.gpu_uuid for dev in plan.devices)
                for gpu_uuid, count in sorted(per_gpu.items()):
                    replicas.add_metric([plan.name, gpu_uuid], count)
        yield devices
        yield replicas

        gpus = GaugeMetricFamily(
            PREFIX + "gpus", "Physical GPUs discovered, by product name.", labels=["model"]
        )
        mig = GaugeMetricFamily(
            PREFIX + "mig_devices", "MIG devices discovered, by MIG profile.", labels=["profile"]
        )
        driver = GaugeMetricFamily(
            PREFIX + "driver_info",
            "The NVIDIA driver in use (value 1); absent until NVML has been read.",
            labels=["driver_version", "cuda_driver_version"],
        )
        if snapshot is not None:
            inventory = snapshot.inventory
            for model, count in sorted(Tally(gpu.name for gpu in inventory.gpus).items()):
                gpus.add_metric([model], count)
            profiles = Tally(m.profile for gpu in inventory.gpus for m in gpu.mig_devices)
            for profile, count in sorted(profiles.items()):
                mig.add_metric([profile], count)
            driver.add_metric([inventory.driver_version, _cuda_version(inventory.cuda_driver_version)], 1)
        yield gpus
        yield mig
        yield driver

        unhealthy = GaugeMetricFamily(
            PREFIX + "unhealthy_device",
            "1 for each physical device (GPU or MIG) kept out of service, with the reason it was taken out.",
            labels=["uuid", "gpu_uuid", "reason"],
        )
        for uuid, reason in sorted(health.unhealthy().items()):
            unhealthy.add_metric([uuid, _gpu_of(uuid, snapshot), reason], 1)
        yield unhealthy

        registered = GaugeMetricFamily(
            PREFIX + "resource_registered",
            "1 when a served resource is registered with kubelet, 0 while it waits to be.",
            labels=["resource"],
        )
        done = daemon.manager.registered()
        for name in sorted(daemon.manager.served()):
            registered.add_metric([name], 1 if name in done else 0)
        yield registered


def _gpu_of(uuid: str, snapshot: SnapshotView | None) -> str:
    """The physical GPU behind a GPU or MIG UUID ("" when the inventory does not know it)."""
    if snapshot is None:
        return ""
    mig = snapshot.inventory.mig_device(uuid)
    if mig is not None:
        return mig.parent_uuid
    return uuid if any(gpu.uuid == uuid for gpu in snapshot.inventory.gpus) else ""


def _cuda_version(encoded: int) -> str:
    """NVML's CUDA driver version (major * 1000 + minor * 10) as "12.4"; "" when unknown."""
    if encoded <= 0:
        return ""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


# ---- HTTP ------------------------------------------------------------------------------------------


def _not_ready_reason(manager: PluginManager) -> str | None:
    """None when every served resource is registered with kubelet; otherwise what is missing."""
    if manager.all_registered():
        return None
    served = manager.served()
    if not served:
        return "not ready: no resources served yet (no GPUs found, NVML unavailable, or still starting)\n"
    waiting = sorted(served - manager.registered())
    return "not ready: waiting for kubelet to register " + ", ".join(waiting) + "\n"


def _handler_class(
    registry: CollectorRegistry, manager: PluginManager
) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = f"nvidia-device-plugin/{__version__}"

        def do_GET(self) -> None:
            self._answer(send_body=True)

        def do_HEAD(self) -> None:
            self._answer(send_body=False)

        def _answer(self, send_body: bool) -> None:
            path = urlsplit(self.path).path
            if path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                try:
                    body = encoder(registry)
                except Exception:
                    log.exception("metrics: collecting failed")
                    self._send(
                        500, b"collecting metrics failed; see the plugin log\n", "text/plain", send_body
                    )
                    return
                self._send(200, body, content_type, send_body)
            elif path == "/healthz":
                self._send(200, b"ok\n", "text/plain; charset=utf-8", send_body)
            elif path == "/readyz":
                reason = _not_ready_reason(manager)
                if reason is None:
                    self._send(200, b"ok\n", "text/plain; charset=utf-8", send_body)
                else:
                    self._send(503, reason.encode(), "text/plain; charset=utf-8", send_body)
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
            log.debug("metrics http: " + format, *args)

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True  # a hung scraper must not keep the process alive at exit


class _Server6(_Server):
    address_family = socket.AF_INET6


class MetricsServer:
    """The running /metrics, /healthz, /readyz server; stop() shuts it down and joins its thread."""

    def __init__(self, server: _Server, registry: CollectorRegistry, unhook: Callable[[], None]) -> None:
        self.registry = registry
        self._server = server
        self._unhook = unhook
        host, port = server.server_address[:2]
        self.host: str = str(host)
        self.port: int = int(port)
        self._thread = threading.Thread(
            target=server.serve_forever, args=(_SHUTDOWN_POLL_SECONDS,), name="metrics-http", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        log.info("metrics: serving /metrics, /healthz and /readyz on %s:%d", self.host, self.port)

    def stop(self) -> None:
        self._unhook()
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()
        log.info("metrics: stopped")


def start_metrics(address: str, daemon: DaemonView) -> MetricsServer:
    """Listen on `address` ("host:port", ":port"; port 0 picks a free one) and hook into `daemon`.

    Raises ConfigError for a malformed address and DevicePluginError when the port cannot be bound.
    """
    host, port = parse_address(address)
    registry = CollectorRegistry()
    events = _Events(registry)
    Info(PREFIX + "build", "Version of this plugin and of the Python running it.", registry=registry).info(
        {"version": __version__, "python_version": platform.python_version()}
    )
    registry.register(_StateCollector(daemon))
    server_class = _Server6 if ":" in host else _Server
    try:
        server = server_class((host, port), _handler_class(registry, daemon.manager))
    except OSError as exc:
        raise DevicePluginError(
            f"cannot serve metrics on --metrics-address {address!r}: {exc.strerror or exc}"
        ) from None
    metrics = MetricsServer(server, registry, _hook(events, daemon))
    metrics.start()
    return metrics


def _hook(events: _Events, daemon: DaemonView) -> Callable[[], None]:
    """Append the event hooks to the daemon's lists; returns a function that takes them out again."""
    manager, previous = daemon.manager, daemon.manager.events
    manager.events = events
    detach = [
        lambda: setattr(manager, "events", previous),
        _attach(daemon.reload_listeners, events.on_reload),
        _attach(daemon.xid_listeners, events.on_xid),
        daemon.registry.subscribe(events.on_health_change),
    ]
    for name in daemon.manager.served():
        events.touch_resource(name)

    def unhook() -> None:
        for undo in detach:
            undo()

    return unhook


def _attach(hooks: list[T], hook: T) -> Callable[[], None]:
    hooks.append(hook)

    def detach() -> None:
        if hook in hooks:
            hooks.remove(hook)

    return detach

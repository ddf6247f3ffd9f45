"""Prometheus metrics of the daemon (served over HTTP by probes.py).

What the daemon advertises (devices per resource and health, GPUs, replicas, unhealthy devices and why) is
computed at scrape time from the daemon's snapshot and health registry, so it can never drift from what
kubelet sees. What happens (Allocate calls, XIDs, registrations, kubelet restarts, reloads) arrives through
the typed Events interface (events.py), which DaemonMetrics implements; those calls run on gRPC and health
threads and only bump counters.

Every metric lives in a private CollectorRegistry, so tests and several daemons in one process never share
counters. Names follow Prometheus conventions: prefix `nvidia_device_plugin_`, `_total` for counters,
`_seconds` for durations. docs/metrics.md lists every metric.
"""

from __future__ import annotations

import logging
import platform
from collections import Counter as Tally
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from nvidia_device_plugin import __version__
from nvidia_device_plugin.config.sharing_modes import sharing_mode
from nvidia_device_plugin.events import CallError, CallMethod, Events, HealthChange
from nvidia_device_plugin.health.policy import known_xid

if TYPE_CHECKING:  # only named in annotations: the daemon hands over these objects
    from nvidia_device_plugin.config.v1 import Config
    from nvidia_device_plugin.devices import Inventory
    from nvidia_device_plugin.health.registry import HealthRegistry
    from nvidia_device_plugin.plans.resources import ResourcePlan
    from nvidia_device_plugin.plugin.manager import PluginManager

log = logging.getLogger(__name__)

PREFIX = "nvidia_device_plugin_"
# Allocate answers in well under a millisecond on a healthy node; a slow one (NVML calls, a busy node)
# takes tens of milliseconds, and kubelet gives up after its own timeout, so nothing past a second matters.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
ERROR_CODES: tuple[CallError, ...] = get_args(CallError)


class SnapshotView(Protocol):
    """What metrics read from the daemon's current snapshot."""

    @property
    def config(self) -> Config: ...

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


# ---- exposition formats ----------------------------------------------------------------------------

OPENMETRICS = "application/openmetrics-text"
_ESCAPINGS = ("allow-utf-8", "underscores", "dots", "values")  # prometheus_client's; others: underscores


def _version(text: str) -> tuple[int, ...] | None:
    parts = text.split(".")
    return tuple(int(p) for p in parts) if text and all(p.isdigit() and len(p) < 6 for p in parts) else None


def negotiate(accept: str) -> str:
    """The Accept header reduced to the format prometheus_client would serve for it, as an Accept header.

    prometheus_client serves a handful of formats (text 0.0.4; text 1.0.0 and OpenMetrics 1.0.0 / 2.0.0,
    each in four name escapings); whatever a client writes (q-values, other types, any version string)
    comes down to one of them, so a render cache keyed by the answer stays small and a fresh header per
    scrape still hits it. Rules as choose_encoder's, except that an OpenMetrics or text version is named
    by its major version (the body depends on no more), and a version that is not a number is skipped
    like one below 1.0.0 (choose_encoder fails on it).
    """
    for entry in accept.split(",")[:32]:
        mime, *params = (p.strip() for p in entry.split(";"))
        values: dict[str, str] = {}
        for param in params:
            key, sep, value = param.partition("=")
            if sep:
                values.setdefault(key.strip(), value.strip())
        version = _version(values.get("version", ""))
        escaping = values.get("escaping", "underscores")
        escaping = escaping if escaping in _ESCAPINGS else "underscores"
        if mime == OPENMETRICS and not values.get("version"):
            return OPENMETRICS
        if version is None or version < (1, 0, 0) or mime not in (OPENMETRICS, "text/plain"):
            continue
        major = "2.0.0" if mime == OPENMETRICS and version >= (2, 0, 0) else "1.0.0"
        return f"{mime}; version={major}; escaping={escaping}"
    return ""


# ---- metrics ---------------------------------------------------------------------------------------


class DaemonMetrics(Events):
    """The daemon's metrics: counters fed through the Events interface, gauges computed at scrape time.

    Every method runs on gRPC, registrar, health or watcher threads and only updates a counter.
    """

    registry: CollectorRegistry
    mig_violations: Counter
    # kubelet's calls, by resource
    allocations: Counter
    allocate_errors: Counter
    allocate_seconds: Histogram
    preferred_errors: Counter
    preferred_seconds: Histogram
    # what happened on the node and to the daemon
    xids: Counter
    health_changes: Counter
    registrations: Counter
    kubelet_restarts: Counter
    reloads: Counter
    mps_readiness_changes: Counter
    nvml_stuck_calls: Gauge
    nvml_slow_calls: Counter

    def __init__(self, daemon: DaemonView) -> None:
        self.registry = CollectorRegistry()
        Info(
            PREFIX + "build", "Version of this plugin and of the Python running it.", registry=self.registry
        ).info({"version": __version__, "python_version": platform.python_version()})
        self.mig_violations = self._counter(
            "mig_strategy_violations",
            "GPUs left out of the advertised resources because they break flags.migStrategy, counted at "
            "each start or reload that found them, by GPU and strategy.",
            ["gpu", "strategy"],
        )
        self._add_call_metrics()
        self._add_event_counters()
        for health in ("healthy", "unhealthy"):
            self.health_changes.labels(health)
        for result in ("applied", "rejected"):
            self.reloads.labels(result)
        self.nvml_stuck_calls = Gauge(
            PREFIX + "nvml_stuck_calls",
            "NVML calls that passed their deadline and have not returned yet, by pynvml function (their "
            "GPU is served Unhealthy meanwhile).",
            ["call"],
            registry=self.registry,
        )
        self.nvml_slow_calls = self._counter(
            "nvml_slow_calls",
            "NVML calls that returned but took a quarter of their deadline or more (--nvml-call-deadline), "
            "by pynvml function; the log names the GPU.",
            ["call"],
        )
        self.registry.register(_StateCollector(daemon))

    def _counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(PREFIX + name, documentation, labels, registry=self.registry)

    def _latency(self, name: str, documentation: str) -> Histogram:
        return Histogram(
            PREFIX + name, documentation, ["resource"], buckets=LATENCY_BUCKETS, registry=self.registry
        )

    def _add_call_metrics(self) -> None:
        self.allocations = self._counter(
            "allocations", "Allocate calls answered successfully, by resource.", ["resource"]
        )
        self.allocate_errors = self._counter(
            "allocate_errors",
            "Allocate calls refused (invalid_argument) or failed (internal), by resource.",
            ["resource", "code"],
        )
        self.allocate_seconds = self._latency(
            "allocate_duration_seconds", "Time to answer an Allocate call, successful or not, by resource."
        )
        self.preferred_errors = self._counter(
            "preferred_allocation_errors",
            "GetPreferredAllocation calls refused (invalid_argument) or failed (internal), by resource.",
            ["resource", "code"],
        )
        self.preferred_seconds = self._latency(
            "preferred_allocation_duration_seconds",
            "Time to answer a GetPreferredAllocation call, successful or not, by resource.",
        )

    def _add_event_counters(self) -> None:
        self.xids = self._counter(
            "xid_events",
            'XID events from NVML, by GPU and XID (known XIDs by number, others as xid="other"); '
            "critical=true when the event made a device unhealthy.",
            ["gpu_uuid", "xid", "critical"],
        )
        self.health_changes = self._counter(
            "device_health_changes",
            "Physical devices (GPU or MIG) that turned unhealthy or healthy again.",
            ["health"],
        )
        self.registrations = self._counter(
            "registrations",
            "Successful registrations with kubelet, by resource (one per start, kubelet restart or rebind).",
            ["resource"],
        )
        self.kubelet_restarts = self._counter(
            "kubelet_restarts", "Times kubelet re-created its registration socket (a kubelet restart)."
        )
        self.reloads = self._counter(
            "config_reloads",
            "Config reloads, by result: applied, or rejected (the previous config keeps being served).",
            ["result"],
        )
        self.mps_readiness_changes = self._counter(
            "mps_readiness_changes",
            "MPS control daemon readiness readings that changed (and first readings), by GPU and new state.",
            ["gpu_uuid", "ready"],
        )

    def render(self, accept: str) -> tuple[bytes, str]:
        """The exposition for an HTTP Accept header: (body, content type)."""
        encoder, content_type = choose_encoder(negotiate(accept))
        return encoder(self.registry), content_type

    def touch_resource(self, resource: str) -> None:
        """Make a resource's counters appear at 0, so rate() and absent() work from its first scrape."""
        self.allocations.labels(resource)
        self.allocate_seconds.labels(resource)
        self.preferred_seconds.labels(resource)
        for code in ERROR_CODES:
            self.allocate_errors.labels(resource, code)
            self.preferred_errors.labels(resource, code)

    # Events: called on gRPC, registrar and health threads; each only updates counters.

    def call_answered(
        self,
        resource: str,
        method: CallMethod,
        seconds: float,
        error: CallError | None,
    ) -> None:
        if method == "Allocate":
            self.allocate_seconds.labels(resource).observe(seconds)
            if error is None:
                self.allocations.labels(resource).inc()
            else:
                self.allocate_errors.labels(resource, error).inc()
        else:
            self.preferred_seconds.labels(resource).observe(seconds)
            if error is not None:
                self.preferred_errors.labels(resource, error).inc()

    def registered(self, resource: str) -> None:
        self.touch_resource(resource)
        self.registrations.labels(resource).inc()

    def kubelet_restarted(self) -> None:
        self.kubelet_restarts.inc()

    def config_reloaded(self, applied: bool, error: str) -> None:
        self.reloads.labels("applied" if applied else "rejected").inc()

    def xid_seen(self, gpu_uuid: str, xid: int, critical: bool) -> None:
        # Known XIDs by number, the rest as "other": a GPU that reports ever-new values cannot grow the
        # series without bound (gpu_uuid is bounded by the inventory: the monitor drops foreign GPUs).
        label = str(xid) if known_xid(xid) else "other"
        self.xids.labels(gpu_uuid, label, "true" if critical else "false").inc()

    def health_changed(self, change: HealthChange) -> None:
        self.health_changes.labels("healthy" if change.healthy else "unhealthy").inc()

    def mps_readiness_changed(self, gpu_uuid: str, ready: bool) -> None:
        self.mps_readiness_changes.labels(gpu_uuid, "true" if ready else "false").inc()

    def mig_strategy_violation(self, gpu_uuid: str, strategy: str) -> None:
        self.mig_violations.labels(gpu_uuid, strategy).inc()

    def nvml_call_slow(self, call: str, where: str, seconds: float) -> None:
        self.nvml_slow_calls.labels(call).inc()

    def nvml_call_stuck(self, call: str, stuck: bool) -> None:
        gauge = self.nvml_stuck_calls.labels(call)
        if stuck:
            gauge.inc()
        else:
            gauge.dec()


class _StateCollector(Collector):
    """Gauges computed from the daemon's snapshot, health registry and plugin manager at each scrape."""

    def __init__(self, daemon: DaemonView) -> None:
        self._daemon = daemon

    def collect(self) -> Iterable[Metric]:
        daemon = self._daemon
        snapshot = daemon.snapshot
        yield from _device_gauges(snapshot.plans if snapshot is not None else (), daemon.registry)
        yield from _inventory_gauges(snapshot.inventory if snapshot is not None else None)
        yield _unknown_keys_gauge(snapshot.config if snapshot is not None else None)
        yield _active_config_gauge(snapshot.config if snapshot is not None else None)
        yield _unhealthy_gauge(daemon.registry, snapshot.inventory if snapshot is not None else None)
        yield _registered_gauge(daemon.manager)


def _device_gauges(plans: Sequence[ResourcePlan], health: HealthRegistry) -> Iterable[Metric]:
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
        if sharing_mode(plan.sharing).shares_devices:
            per_gpu = Tally(dev.gpu_uuid for dev in plan.devices)
            for gpu_uuid, count in sorted(per_gpu.items()):
                replicas.add_metric([plan.name, gpu_uuid], count)
    return devices, replicas


def _inventory_gauges(inventory: Inventory | None) -> Iterable[Metric]:
    gpus = GaugeMetricFamily(PREFIX + "gpus", "Physical GPUs discovered, by product name.", labels=["model"])
    mig = GaugeMetricFamily(
        PREFIX + "mig_devices", "MIG devices discovered, by MIG profile.", labels=["profile"]
    )
    driver = GaugeMetricFamily(
        PREFIX + "driver_info",
        "The NVIDIA driver in use (value 1); absent until NVML has been read.",
        labels=["driver_version", "cuda_driver_version"],
    )
    if inventory is not None:
        for model, count in sorted(Tally(gpu.name for gpu in inventory.gpus).items()):
            gpus.add_metric([model], count)
        profiles = Tally(m.profile for gpu in inventory.gpus for m in gpu.mig_devices)
        for profile, count in sorted(profiles.items()):
            mig.add_metric([profile], count)
        cuda = inventory.cuda_version
        driver.add_metric([inventory.driver_version, f"{cuda[0]}.{cuda[1]}" if cuda else ""], 1)
    return gpus, mig, driver


def _unknown_keys_gauge(config: Config | None) -> Metric:
    unknown_keys = GaugeMetricFamily(
        PREFIX + "config_unknown_keys",
        "1 for each key of the served config that this plugin does not know and ignores (check-config "
        "refuses them; NVIDIA ignores them silently).",
        labels=["key"],
    )
    for key in sorted(set(config.unknown_keys) if config is not None else ()):
        unknown_keys.add_metric([key], 1)
    return unknown_keys


def _active_config_gauge(config: Config | None) -> Metric:
    active = GaugeMetricFamily(
        PREFIX + "active_config",
        "1 for the config served: the file read (empty for the built-in defaults) and how it was chosen "
        "(config-file, config-name, config-default, fallback-named, fallback-single, fallback-empty, "
        "node-label, defaults).",
        labels=["file", "source"],
    )
    origin = config.origin if config is not None else None
    if origin is not None:
        active.add_metric([origin.file, origin.choice], 1)
    return active


def _unhealthy_gauge(health: HealthRegistry, inventory: Inventory | None) -> Metric:
    unhealthy = GaugeMetricFamily(
        PREFIX + "unhealthy_device",
        "1 for each physical device (GPU or MIG) kept out of service, with the reason it was taken out.",
        labels=["uuid", "gpu_uuid", "reason"],
    )
    for uuid, reason in sorted(health.unhealthy().items()):
        gpu = inventory.gpu_of(uuid) if inventory is not None else None
        unhealthy.add_metric([uuid, gpu.uuid if gpu is not None else "", reason], 1)
    return unhealthy


def _registered_gauge(manager: PluginManager) -> Metric:
    registered = GaugeMetricFamily(
        PREFIX + "resource_registered",
        "1 when a served resource is registered with kubelet, 0 while it waits to be.",
        labels=["resource"],
    )
    done = manager.registered()
    for name in sorted(manager.served()):
        registered.add_metric([name], 1 if name in done else 0)
    return registered

"""The daemon: owns every thread of the process and wires the snapshot pipeline to the plugin servers.

NVML session + config -> build_snapshot -> one plugin server per resource plan; health changes and config
reloads feed the same path. Lifecycle (one log line each): starting, NVML ready, inventory discovered,
serving, config reloaded or rejected, stopping, stopped. Reloads and health changes never restart the
process: the plugin manager diffs the new resource set against what it serves.

The daemon does not know whether NVML is real or simulated beyond `NvmlSession.simulated`: the caller
hands it a function that opens the session (cli.py and demo.py choose, and drive a simulator themselves).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.cdi.writer import CdiPublisher
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.config.watch import ConfigWatcher
from nvidia_device_plugin.devices import describe
from nvidia_device_plugin.errors import ConfigError, DevicePluginError, NvmlError
from nvidia_device_plugin.events import HealthChange
from nvidia_device_plugin.health.monitor import HealthMonitor
from nvidia_device_plugin.health.registry import HealthRegistry, health_dependencies, mark_lost_at_start_up
from nvidia_device_plugin.labels import LabelsFileWriter, LabelsOptions
from nvidia_device_plugin.metrics import DaemonMetrics
from nvidia_device_plugin.nvml.session import NvmlSession
from nvidia_device_plugin.plugin.manager import PluginManager, ResourceSpec
from nvidia_device_plugin.probes import ProbeServer
from nvidia_device_plugin.serving.allocate import imex_problem, imex_summary
from nvidia_device_plugin.serving.backend import GpuResourceBackend
from nvidia_device_plugin.sharing.mps import shared_devices
from nvidia_device_plugin.sharing.readiness import (
    DEFAULT_POLL_INTERVAL_S,
    MpsReadinessWatcher,
    ReadinessChange,
)
from nvidia_device_plugin.snapshot import Snapshot, build_snapshot

log = logging.getLogger(__name__)

# A reload rejected for a transient reason (NVML failing during discovery) is retried with this backoff.
RELOAD_RETRY_MIN_S = 1.0
RELOAD_RETRY_MAX_S = 60.0

ConfigWatcherFactory = Callable[[Callable[[], None]], ConfigWatcher]


@dataclass
class DaemonOptions:
    plugin_dir: Path
    load_config: Callable[[], Config]  # resolves file + env + flags afresh; raises ConfigError
    open_nvml: Callable[[], NvmlSession]  # raises NvmlError on a node without a usable driver
    watch: ConfigWatcherFactory | None = None
    kubelet_socket: str = "kubelet.sock"
    metrics_address: str = ""  # host:port of /metrics, /healthz, /readyz; empty: no HTTP server
    mps_poll_interval_s: float = DEFAULT_POLL_INTERVAL_S  # how often MPS status files are re-read
    labels: LabelsOptions | None = None  # --labels-file: NFD features.d file following every change


class Daemon:
    def __init__(self, options: DaemonOptions) -> None:
        self.options = options
        self.registry = HealthRegistry()
        self.metrics = DaemonMetrics(self)
        self.manager = PluginManager(options.plugin_dir, options.kubelet_socket, events=self.metrics)
        self.snapshot: Snapshot | None = None
        self.nvml: NvmlSession | None = None
        self._reload_lock = threading.Lock()
        self.cdi = CdiPublisher()  # CDI specs of the served snapshot (cdi-annotations / cdi-cri)
        self._reported: set[str] = set()  # discovery problems and MIG violations already logged
        self._retry: threading.Timer | None = None
        self._retry_delay_s = RELOAD_RETRY_MIN_S
        self._monitor: HealthMonitor | None = None
        self._watcher: ConfigWatcher | None = None
        # MPS daemons belong to `mps-control-daemon`; the plugin only reads whether they are ready.
        self.mps_readiness = MpsReadinessWatcher(self._on_mps_readiness_change, options.mps_poll_interval_s)
        self._unsubscribe: Callable[[], None] | None = None
        self._probes = (
            ProbeServer(options.metrics_address, self.metrics.render, self.liveness, self.readiness)
            if options.metrics_address
            else None
        )

        self.labels = (
            LabelsFileWriter(options.labels, lambda: (self.snapshot, self.registry.unhealthy()))
            if options.labels is not None
            else None
        )

    @property
    def probes(self) -> ProbeServer | None:
        return self._probes

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start serving. Raises ConfigError / NvmlError / InventoryError when nothing sane can be served."""
        log.info("starting: device-plugin directory %s", self.options.plugin_dir)
        if self._probes is not None:
            self._probes.start()  # first, so the liveness probe answers while discovery runs
        if self.options.watch is not None:
            # Watch before the first load, so an edit landing during start-up is not missed; its
            # reload waits on the lock below until the first snapshot is served.
            self._watcher = self.options.watch(self._on_config_file_changed)
            self._watcher.start()
        if self.labels is not None:
            self.labels.start()
        with self._reload_lock:
            self._start_serving()

    def _start_serving(self) -> None:
        config = self.options.load_config()
        try:
            self.nvml = self.options.open_nvml()
        except NvmlError as exc:
            if config.flags.fail_on_init_error:
                raise
            # NVIDIA's behaviour: on a node without GPUs, idle instead of crash-looping the DaemonSet pod.
            log.error(
                "%s; failOnInitError is false, so serving no resources (schedule this DaemonSet on GPU "
                "nodes only, or fix the driver and restart the pod)",
                exc,
            )
            self.manager.start()
            if self.labels is not None:
                self.labels.notify()  # no GPUs to label: an empty file clears the node's labels
            return
        snapshot = _servable(build_snapshot(self.nvml, config))
        inventory = snapshot.inventory
        log.info(
            "inventory: %d GPUs (%s), driver %s",
            len(inventory.gpus),
            ", ".join(sorted({g.name for g in inventory.gpus})) or "none",
            inventory.driver_version,
        )
        _announce_config(snapshot, None)
        self._unsubscribe = self.registry.subscribe(self._on_health_change)
        self.manager.start()
        self._report_discovery(snapshot)
        mark_lost_at_start_up(self.registry, snapshot.inventory)
        self._serve(snapshot)
        self.mps_readiness.start()
        self._start_health(snapshot)

    def _on_config_file_changed(self) -> None:
        self.reload("config file changed")

    def stop(self) -> None:
        log.info("stopping")
        if self._retry is not None:
            self._retry.cancel()
        if self._watcher is not None:
            self._watcher.stop()
        if self._monitor is not None:
            self._monitor.stop()
        self.mps_readiness.stop()
        if self.labels is not None:
            self.labels.stop()
        self.manager.stop()
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self.nvml is not None:
            self.nvml.close()
        if self._probes is not None:
            self._probes.stop()
        log.info("stopped")

    # ---- probes -----------------------------------------------------------------------------

    def liveness(self) -> str | None:
        """None while the process does its job; else why the liveness probe should restart it.

        Only the registrar can stall the node for good (a dead thread or a registration that never
        lands): the liveness probe restarts the pod then. A node without resources to serve is live.
        """
        if not self.manager.served():
            return None
        return self.manager.health()

    def readiness(self) -> str | None:
        """None when every served resource is registered with kubelet; otherwise what is missing."""
        manager = self.manager
        if self.cdi.problem is not None:
            return f"not ready: {self.cdi.problem}"
        if manager.all_registered():
            return None
        served = manager.served()
        if not served:
            return "not ready: no resources served yet (no GPUs found, NVML unavailable, or still starting)"
        return "not ready: waiting for kubelet to register " + ", ".join(
            sorted(served - manager.registered())
        )

    # ---- reload -----------------------------------------------------------------------------

    def reload(self, reason: str) -> bool:
        """Apply the current config; on any error keep serving the last good one. True when applied."""
        with self._reload_lock:
            old = self.snapshot
            if old is None or self.nvml is None:
                return False
            try:
                snapshot = _servable(
                    build_snapshot(self.nvml, self.options.load_config(), previous=old.inventory)
                )
            except Exception as exc:  # whatever went wrong, the last good config keeps serving
                message = str(exc) if isinstance(exc, DevicePluginError) else f"{type(exc).__name__}: {exc}"
                log.error(
                    "config reload (%s) rejected, still serving the previous config: %s", reason, message
                )
                self.metrics.config_reloaded(False, message)
                if isinstance(exc, NvmlError):
                    self._schedule_retry(reason)
                return False
            self._retry_delay_s = RELOAD_RETRY_MIN_S
            self._report_discovery(snapshot)
            mark_lost_at_start_up(self.registry, snapshot.inventory)
            _announce_config(snapshot, old)
            self._serve(snapshot)
            if snapshot.config.health != old.config.health or snapshot.inventory != old.inventory:
                self._start_health(snapshot)
            log.info(
                "config reloaded (%s): %s",
                reason,
                ", ".join(f"{p.name} x{len(p.devices)}" for p in snapshot.plans) or "no resources",
            )
            self.metrics.config_reloaded(True, "")
            return True

    def _schedule_retry(self, reason: str) -> None:
        """Retry a reload NVML made fail, with backoff; a later successful reload resets it."""
        pending = self._retry
        if pending is not None and pending.is_alive() and pending is not threading.current_thread():
            return  # one is already waiting; a retry that fails again schedules the next one itself
        delay = self._retry_delay_s
        self._retry_delay_s = min(delay * 2, RELOAD_RETRY_MAX_S)
        log.info("retrying the config reload in %gs (NVML failed during discovery)", delay)
        self._retry = threading.Timer(delay, self.reload, args=(f"retry of: {reason}",))
        self._retry.daemon = True
        self._retry.name = "reload-retry"
        self._retry.start()

    def _report_discovery(self, snapshot: Snapshot) -> None:
        """One line per discovery problem and MIG-strategy violation, when first seen."""
        for problem in snapshot.inventory.problems:
            key = f"problem {problem.gpu_index} {problem.kind}"
            if key not in self._reported:
                self._reported.add(key)
                log.warning("discovery: %s", problem.message)
        for violation in snapshot.mig_violations:
            self.metrics.mig_strategy_violation(violation.gpu_uuid, violation.strategy)
            key = f"mig {violation.gpu_uuid} {violation.strategy} {violation.message}"
            if key not in self._reported:
                self._reported.add(key)
                log.warning("%s", violation.message)

    # ---- internals --------------------------------------------------------------------------

    def _serve(self, snapshot: Snapshot) -> None:
        # Read MPS readiness before the new lists are served, so the first list is already right.
        self.mps_readiness.watch(
            snapshot.config.flags.mps_root,
            ((p.name, uuid) for p in snapshot.plans if p.sharing == "mps" for uuid in shared_devices(p)),
        )
        specs = {
            plan.name: ResourceSpec(
                plan.name,
                plan.socket_name,
                GpuResourceBackend(
                    plan,
                    snapshot.inventory,
                    snapshot.allocation,
                    self.registry,
                    mps_gate=self.mps_readiness if plan.sharing == "mps" else None,
                ),
            )
            for plan in snapshot.plans
        }
        # Written before the servers see the new plans, so every name Allocate returns is defined; when
        # the specs cannot be made, no resource is served rather than names no runtime resolves.
        if self.cdi.publish(snapshot.cdi) is not None:
            specs = {}
        self.snapshot = snapshot
        self.manager.apply(specs)
        if self.labels is not None:
            self.labels.notify()

    def _start_health(self, snapshot: Snapshot) -> None:
        if self._monitor is not None:
            self._monitor.stop()
        assert self.nvml is not None
        self._monitor = HealthMonitor(
            self.nvml.nv,
            snapshot.inventory,
            snapshot.config.health,
            self.registry,
            events=self.metrics,
        )
        self._monitor.start()

    def _on_mps_readiness_change(self, change: ReadinessChange) -> None:
        """One log line per MPS readiness flip, and an immediate ListAndWatch push of its resource."""
        self.metrics.mps_readiness_changed(change.gpu_uuid, change.ready)
        if change.ready:
            log.info(
                "MPS control daemon of GPU %s (%s) is ready: its replicas are advertised Healthy",
                change.gpu_uuid,
                change.resource,
            )
        else:
            log.warning(
                "MPS control daemon of GPU %s (%s) is not ready: %s; its replicas are advertised Unhealthy",
                change.gpu_uuid,
                change.resource,
                change.reason,
            )
        if self.snapshot is not None:
            self.manager.notify(change.resource)

    def _on_health_change(self, change: HealthChange) -> None:
        """The one log line per health change, and an immediate ListAndWatch push where it matters."""
        self.metrics.health_changed(change)
        if self.labels is not None:
            self.labels.notify()
        snapshot = self.snapshot
        if snapshot is None:
            return
        affected = [
            p.name for p in snapshot.plans if any(change.uuid in health_dependencies(d) for d in p.devices)
        ]
        where = describe(snapshot.inventory, change.uuid)
        if change.healthy:
            log.info(
                "%s is healthy again (%s); resources affected: %s",
                where,
                change.reason,
                ", ".join(affected) or "none",
            )
        else:
            log.warning(
                "%s is unhealthy: %s; resources affected: %s",
                where,
                change.reason,
                ", ".join(affected) or "none",
            )
        for name in affected:
            self.manager.notify(name)


def _servable(snapshot: Snapshot) -> Snapshot:
    """`snapshot`, unless its config asks for what this node cannot give (required IMEX channels)."""
    problem = imex_problem(snapshot.allocation)
    if problem is not None:
        raise ConfigError(problem)
    return snapshot


def _announce_config(snapshot: Snapshot, old: Snapshot | None) -> None:
    """One log line for each config fact an operator must know, when it is new (at start, or changed)."""
    config = snapshot.config
    seen = {w.message for w in old.config.warnings} if old is not None else set()
    for warning in config.warnings:
        if warning.message not in seen:
            log.warning("config: %s", warning.message)
    strategy = config.flags.device_discovery_strategy
    if strategy == "tegra" and (old is None or old.config.flags.device_discovery_strategy != strategy):
        log.warning("deviceDiscoveryStrategy tegra is not supported: devices are discovered through NVML")
    if old is None or old.allocation.imex_channel_ids != snapshot.allocation.imex_channel_ids:
        log.info("%s", imex_summary(snapshot.allocation))

"""The daemon: NVML -> inventory -> resources -> plugin servers, with health and config reload feeding in.

Lifecycle (one log line each): starting, NVML ready, inventory discovered, serving, config reloaded
or rejected, stopping, stopped. Reloads and health changes never restart the process: the plugin
manager diffs the new resource set against what it serves.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.allocation import AllocationSettings
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.config.watch import ConfigWatcher
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.errors import DevicePluginError, NvmlError
from nvidia_device_plugin.events import NO_EVENTS, Events, HealthChange
from nvidia_device_plugin.gpu_backend import GpuResourceBackend
from nvidia_device_plugin.health import HealthMonitor
from nvidia_device_plugin.health_state import HealthRegistry
from nvidia_device_plugin.mps import MpsDaemonSupervisor
from nvidia_device_plugin.nvml.backend import NvmlSession, open_nvml
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.sim_events import SimulatedEventFeeder
from nvidia_device_plugin.plugin.manager import PluginManager, ResourceSpec
from nvidia_device_plugin.resources import ResourcePlan, build_resources

log = logging.getLogger(__name__)


@dataclass
class DaemonOptions:
    plugin_dir: Path
    load_config: Callable[[], Config]  # resolves file + env + flags afresh; raises ConfigError
    watch: ConfigWatcherFactory | None = None
    simulate: str | None = None
    simulate_events: Path | None = None
    kubelet_socket: str = "kubelet.sock"
    events: Events = NO_EVENTS


ConfigWatcherFactory = Callable[[Callable[[], None]], ConfigWatcher]


@dataclass(frozen=True)
class Snapshot:
    """What the daemon serves right now; replaced whole on every reload."""

    config: Config
    inventory: Inventory
    plans: tuple[ResourcePlan, ...]


class Daemon:
    def __init__(self, options: DaemonOptions) -> None:
        self.options = options
        self.registry = HealthRegistry()
        self.manager = PluginManager(options.plugin_dir, options.kubelet_socket, events=options.events)
        self.snapshot: Snapshot | None = None
        self.nvml: NvmlSession | None = None
        self.reload_listeners: list[Callable[[bool, str], None]] = []  # f(applied, error)
        self.xid_listeners: list[
            Callable[[str, int, bool], None]
        ] = []  # f(gpu_uuid, xid, counted_as_critical)
        self._reload_lock = threading.Lock()
        self._monitor: HealthMonitor | None = None
        self._watcher: ConfigWatcher | None = None
        self._feeder: SimulatedEventFeeder | None = None
        self._mps: MpsDaemonSupervisor | None = None
        self._mps_plans: list[ResourcePlan] = []
        self._unsubscribe: Callable[[], None] | None = None

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start serving. Raises ConfigError / NvmlError / InventoryError when nothing sane can be served."""
        log.info("starting: device-plugin directory %s", self.options.plugin_dir)
        if self.options.watch is not None:
            # Watch before the first load, so an edit landing during start-up is not missed; its
            # reload waits on the lock below until the first snapshot is served.
            self._watcher = self.options.watch(self._on_config_file_changed)
            self._watcher.start()
        with self._reload_lock:
            self._start_serving()

    def _start_serving(self) -> None:
        config = self.options.load_config()
        try:
            self.nvml = open_nvml(self.options.simulate)
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
            return
        inventory = discover(self.nvml.nv, self.nvml.sysfs_root)
        log.info(
            "inventory: %d GPUs (%s), driver %s",
            len(inventory.gpus),
            ", ".join(sorted({g.name for g in inventory.gpus})) or "none",
            inventory.driver_version,
        )
        snapshot = Snapshot(config, inventory, build_resources(inventory, config))
        self._unsubscribe = self.registry.subscribe(self._on_health_change)
        self.manager.start()
        self._serve(snapshot)
        self._start_health(snapshot)
        if self.nvml.simulator is not None and self.options.simulate_events is not None:
            self._feeder = SimulatedEventFeeder(self.options.simulate_events, self.nvml.simulator)
            self._feeder.start()

    def _on_config_file_changed(self) -> None:
        self.reload("config file changed")

    def stop(self) -> None:
        log.info("stopping")
        if self._watcher is not None:
            self._watcher.stop()
        if self._feeder is not None:
            self._feeder.stop()
        if self._monitor is not None:
            self._monitor.stop()
        if self._mps is not None:
            self._mps.stop()
        self.manager.stop()
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self.nvml is not None:
            self.nvml.close()
        log.info("stopped")

    # ---- reload -----------------------------------------------------------------------------

    def reload(self, reason: str) -> bool:
        """Apply the current config; on any error keep serving the last good one. True when applied."""
        with self._reload_lock:
            old = self.snapshot
            if old is None or self.nvml is None:
                return False
            try:
                config = self.options.load_config()
                inventory = discover(self.nvml.nv, self.nvml.sysfs_root)
                plans = build_resources(inventory, config)
            except DevicePluginError as exc:
                log.error("config reload (%s) rejected, still serving the previous config: %s", reason, exc)
                self._notify_reload(False, str(exc))
                return False
            snapshot = Snapshot(config, inventory, plans)
            self._serve(snapshot)
            if config.health != old.config.health or inventory != old.inventory:
                self._start_health(snapshot)
            log.info(
                "config reloaded (%s): %s",
                reason,
                ", ".join(f"{p.name} x{len(p.devices)}" for p in plans) or "no resources",
            )
            self._notify_reload(True, "")
            return True

    def _notify_reload(self, ok: bool, error: str) -> None:
        for listener in self.reload_listeners:
            listener(ok, error)

    # ---- internals --------------------------------------------------------------------------

    def _serve(self, snapshot: Snapshot) -> None:
        settings = AllocationSettings.from_config(snapshot.config)
        specs = {
            plan.name: ResourceSpec(
                plan.name,
                plan.socket_name,
                GpuResourceBackend(plan, snapshot.inventory, settings, self.registry),
            )
            for plan in snapshot.plans
        }
        self.snapshot = snapshot
        self.manager.apply(specs)
        self._supervise_mps(snapshot)

    def _supervise_mps(self, snapshot: Snapshot) -> None:
        mps_plans = [p for p in snapshot.plans if p.sharing == "mps"]
        if self._mps is not None:
            if self._mps_plans == mps_plans:
                return  # quitting MPS daemons would kill every running MPS client for nothing
            # Daemons of GPUs that stay shared are adopted by the new supervisor via their pid files.
            self._mps.stop(quit_daemons=not mps_plans)
            self._mps = None
        self._mps_plans = mps_plans
        if mps_plans:
            self._mps = MpsDaemonSupervisor(
                mps_plans,
                snapshot.config.flags.mps_root,
                simulated=self.nvml is not None and self.nvml.simulated,
            )
            self._mps.start()

    def _start_health(self, snapshot: Snapshot) -> None:
        if self._monitor is not None:
            self._monitor.stop()
        assert self.nvml is not None
        self._monitor = HealthMonitor(
            self.nvml.nv, snapshot.inventory, snapshot.config.health, self.registry, on_xid=self._on_xid
        )
        self._monitor.start()

    def _on_xid(self, gpu_uuid: str, xid: int, critical: bool) -> None:
        for listener in self.xid_listeners:
            listener(gpu_uuid, xid, critical)

    def _on_health_change(self, change: HealthChange) -> None:
        """The one log line per health change, and an immediate ListAndWatch push where it matters."""
        snapshot = self.snapshot
        if snapshot is None:
            return
        affected = [
            p.name
            for p in snapshot.plans
            if any(change.uuid in (d.physical_uuid, d.gpu_uuid) for d in p.devices)
        ]
        where = _describe_device(snapshot.inventory, change.uuid)
        if change.healthy:
            log.info(
                "%s (%s) is healthy again (%s); resources affected: %s",
                where,
                change.uuid,
                change.reason,
                ", ".join(affected) or "none",
            )
        else:
            log.warning(
                "%s (%s) is unhealthy: %s; resources affected: %s",
                where,
                change.uuid,
                change.reason,
                ", ".join(affected) or "none",
            )
        for name in affected:
            self.manager.notify(name)


def _describe_device(inventory: Inventory, uuid: str) -> str:
    for gpu in inventory.gpus:
        if gpu.uuid == uuid:
            return f"GPU {gpu.index}"
        for mig in gpu.mig_devices:
            if mig.uuid == uuid:
                return f"MIG device {gpu.index}:{mig.index}"
    return "device"

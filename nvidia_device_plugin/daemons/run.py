"""The daemon of `run`: owns every worker of the process and wires the snapshot pipeline to the servers.

NVML session + config -> build_snapshot -> one plugin server per resource plan; health changes and config
reloads (follower.SnapshotFollower) feed the same path. Lifecycle (one log line each): starting, inventory
discovered, serving, config reloaded or rejected, stopping, stopped. Reloads and health changes never restart
the process: the plugin manager diffs the new resource set against what it serves.

Every thread of the process belongs to one of the daemon's `workers`, in start order (stopped in reverse):
the probes server (first, so the liveness probe answers while discovery runs), the node-label follower
(its config file must exist before the first load), the config watch (its fingerprint before the first load,
so an edit during start-up is not missed; its event watch once kubelet has every resource registered), the
labels writer, the reload retry, the GPU re-discovery;
then, once NVML is open, the plugin manager (its registrar and gRPC servers) and the health monitor of the
served snapshot; last the simulated events feeder, once health is watched. What only some configs use joins
when a served snapshot first uses it: MPS readiness (an MPS plan), the DRA side's workers (dra.enabled).
The CDI spec publisher, which has no thread, is made the same way (a CDI strategy). A MIG device dynamic
MIG made or destroyed comes in through the same follower (its GPU read again, no rediscovery of the node),
so the labels, metrics, health monitor and DRA slices follow it from that one apply.
Stopping lets NVML go first (`stop_waiting`: no thread waits on a call a GPU reset hung, so the stop ends
well within kubelet's grace period), then stops the workers, then shuts NVML down unless a call still holds
it (nvml/bounded.py names that call).

The daemon does not know whether NVML is real or simulated: the caller hands it a function that opens the
session, and drives a simulator itself through the `simulated_events` worker it passes in (cli/ chooses).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nvidia_device_plugin.base.errors import ConfigError, NvmlError
from nvidia_device_plugin.base.logs import FailureLog, RateLimitedLog
from nvidia_device_plugin.base.workers import Worker, WorkerGroup
from nvidia_device_plugin.cdi.model import CdiError, CdiPlan
from nvidia_device_plugin.config.sharing_modes import sharing_mode
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.daemons.announce import config_line, decisions, notices, resources_line
from nvidia_device_plugin.daemons.follower import (
    REDISCOVERY_INTERVAL_S,
    RELOAD_RETRY_MAX_S,
    RELOAD_RETRY_MIN_S,
    InventoryEdit,
    SnapshotFollower,
)
from nvidia_device_plugin.devices import describe
from nvidia_device_plugin.dra.options import DraOptions
from nvidia_device_plugin.dra.side import DraSide
from nvidia_device_plugin.events import HealthChange
from nvidia_device_plugin.health.monitor import HealthMonitor
from nvidia_device_plugin.health.registry import (
    HealthRegistry,
    bring_back_rediscovered,
    health_dependencies,
    mark_lost_at_start_up,
    mark_lost_on_reload,
)
from nvidia_device_plugin.nvml.session import NvmlSession
from nvidia_device_plugin.plugin.manager import KUBELET_STREAM_GRACE_S, PluginManager, ResourceSpec
from nvidia_device_plugin.serving.backend import GpuResourceBackend
from nvidia_device_plugin.serving.imex import imex_problem, imex_summary
from nvidia_device_plugin.sharing.mps import shared_devices
from nvidia_device_plugin.snapshot import Snapshot
from nvidia_device_plugin.telemetry.on_demand import daemon_events, probe_server

if TYPE_CHECKING:  # types only: these load when a config file, --labels-file, MPS or CDI asks for them
    from nvidia_device_plugin.cdi.writer import CdiPublisher
    from nvidia_device_plugin.config.watch import ConfigWatcher
    from nvidia_device_plugin.labels.writer import LabelsFileWriter, LabelsOptions
    from nvidia_device_plugin.sharing.readiness import MpsReadinessWatcher, ReadinessChange
    from nvidia_device_plugin.telemetry.probes import ProbeServer

log = logging.getLogger(__name__)

# (on_change, defer_events), config/watch.py: the Daemon defers the event watch until kubelet has resources.
ConfigWatcherFactory = Callable[[Callable[[], None], bool], "ConfigWatcher"]


@dataclass
class DaemonOptions:
    """What a Daemon is made from: paths, the config and NVML openers, the optional parts."""

    plugin_dir: Path
    load_config: Callable[[], Config]  # resolves file + env + flags afresh; raises ConfigError
    open_nvml: Callable[[], NvmlSession]  # raises NvmlError on a node without a usable driver
    watch: ConfigWatcherFactory | None = None
    kubelet_socket: str = "kubelet.sock"
    metrics_address: str = ""  # host:port of /metrics, /healthz, /readyz; empty: no HTTP server
    # How long one /metrics render is shared by every scrape; None: telemetry.probes.RENDER_CACHE_S.
    metrics_render_cache_s: float | None = None
    # Metrics counted without an HTTP server (read in-process); `run` counts only what it serves.
    count_metrics: bool = True
    # How often MPS status files are re-read; None: sharing.readiness.DEFAULT_POLL_INTERVAL_S.
    mps_poll_interval_s: float | None = None
    labels: LabelsOptions | None = None  # --labels-file: NFD features.d file following every change
    # --node-config-label: keeps the config file `load_config` reads linked to the one the node's label
    # names (configmanager.inprocess.NodeLabelConfig); its start makes the first choice or raises.
    node_config: Worker | None = None
    # --simulate-events: drives the simulated NVML `open_nvml` returns (nvml.sim.events).
    simulated_events: Worker | None = None
    # Where the DRA mode finds the node's kubelet and API (cli/dra.py); the config's dra.enabled turns it on.
    dra: DraOptions | None = None
    rediscovery_interval_s: float = REDISCOVERY_INTERVAL_S  # how often GPUs held as lost are read again
    # A reload NVML (or CDI) made fail is retried after reload_retry_min_s, doubling to reload_retry_max_s.
    reload_retry_min_s: float = RELOAD_RETRY_MIN_S
    reload_retry_max_s: float = RELOAD_RETRY_MAX_S
    # How long a registered resource may go without kubelet's ListAndWatch stream before /healthz fails.
    kubelet_stream_grace_s: float = KUBELET_STREAM_GRACE_S


class Daemon:
    def __init__(self, options: DaemonOptions) -> None:
        self.options = options
        self.registry = HealthRegistry()
        self.metrics = daemon_events(self, options.count_metrics or bool(options.metrics_address))
        self.manager = PluginManager(
            options.plugin_dir,
            options.kubelet_socket,
            events=self.metrics,
            stream_grace_seconds=options.kubelet_stream_grace_s,
            after_first_registrations=self._after_first_registrations,
        )
        self.snapshot: Snapshot | None = None
        self.nvml: NvmlSession | None = None
        # CDI specs of the served snapshot (cdi-annotations / cdi-cri), keeping the names kubelet's
        # checkpoint still holds: made when a snapshot first has CDI specs (_publish_cdi). `_cdi_retrying`:
        # why a reload is being retried for CDI, while it is.
        self._cdi: CdiPublisher | None = None
        self._cdi_retrying: str | None = None
        self._discovery = FailureLog(log)  # the snapshot's warnings (announce.notices), each logged once
        self._noticed: set[str] = set()  # their keys, as last logged
        self._health_lines = RateLimitedLog(log)  # health changes, per device
        # The DRA side: off until a config first turns dra.enabled on (_start_dra), then the DRA mode.
        self.dra = DraSide(
            options.dra,
            self.registry.verdicts,
            self._on_dra_owners_changed,
            edit_inventory=self._edit_inventory,
        )
        self.reloads = self._follower()
        self._monitor: HealthMonitor | None = None
        # MPS daemons belong to `mps-control-daemon`; the plugin only reads whether they are ready: made,
        # and its thread started, when a snapshot first serves MPS (_mps_readiness_for).
        self._mps_readiness: MpsReadinessWatcher | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._probes = probe_server(
            options.metrics_address,
            self.metrics,
            self.liveness,
            self.readiness,
            options.metrics_render_cache_s,
        )
        self.labels = self._labels_writer(options.labels)
        self.workers = WorkerGroup()  # every thread of the process, in start order (see the module doc)
        watcher = options.watch(self._on_config_file_changed, True) if options.watch is not None else None
        self._config_watcher = watcher
        for part in (
            self._health_lines,  # its summaries: stopped last, after every thread that logs through it
            self._probes,
            options.node_config,
            watcher,
            self.labels.worker if self.labels is not None else None,
            self.reloads.retry,
            self.reloads.rediscovery,
        ):
            if part is not None:
                self.workers.add(part)

    def _labels_writer(self, options: LabelsOptions | None) -> LabelsFileWriter | None:
        if options is None:
            return None
        # Here, not at the top: the label pipeline (GFD's rules) loads only when --labels-file asks for it.
        from nvidia_device_plugin.labels.writer import LabelsFileWriter

        return LabelsFileWriter(options, lambda: (self.snapshot, self.registry.unhealthy()))

    def _follower(self) -> SnapshotFollower:
        """The one way the served snapshot changes (reloads, retries, re-discovery): see SnapshotFollower."""
        options = self.options
        return SnapshotFollower(
            options.load_config,
            self._apply_reload,
            check=lambda snapshot: self.dra.check(self._servable(snapshot)),
            kept="still serving the previous config",
            on_result=self.metrics.config_reloaded,
            rediscovery_interval_s=options.rediscovery_interval_s,
            retry_min_s=options.reload_retry_min_s,
            retry_max_s=options.reload_retry_max_s,
        )

    @property
    def probes(self) -> ProbeServer | None:
        return self._probes

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start serving. Raises ConfigError / NvmlError / InventoryError when nothing sane can be served."""
        log.info("starting: device-plugin directory %s", self.options.plugin_dir)
        self.workers.start_all()
        with self.reloads.lock:  # a reload asked for meanwhile waits until the first snapshot is served
            self._start_serving()
        if self.options.simulated_events is not None:
            self.workers.start(self.options.simulated_events)

    def _start_serving(self) -> None:
        config = self.options.load_config()
        log.info("%s", config_line(config))
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
            self.workers.start(self.manager)
            if self.labels is not None:
                self.labels.notify()  # no GPUs to label: an empty file clears the node's labels
            return
        if self.nvml.calls is not None:  # NVML calls past their deadline: a gauge by call; slow ones counted
            self.nvml.calls.subscribe(self.metrics.nvml_call_stuck)
            self.nvml.calls.subscribe_slow(self.metrics.nvml_call_slow)
        snapshot = self.reloads.first(self.nvml, config)
        inventory = snapshot.inventory
        log.info(
            "inventory: %d GPUs (%s), driver %s",
            len(inventory.gpus),
            ", ".join(sorted({g.name for g in inventory.gpus})) or "none",
            inventory.driver_version,
        )
        self._announce(snapshot, None)
        self._unsubscribe = self.registry.subscribe(self._on_health_change)
        self.workers.start(self.manager)
        mark_lost_at_start_up(self.registry, snapshot.inventory)
        self._serve(snapshot)
        self._watch_health(snapshot)
        if (problem := self.cdi_problem) is not None:  # a driver root mounted late, say: retried with backoff
            log.error("%s; serving no resources, retrying with backoff", problem)
            self.reloads.retry_later("CDI specs could not be made at start", cdi=True)

    def _after_first_registrations(self) -> None:
        """Kubelet has every served resource registered: the config watch may make its event watch now (its
        import and threads no longer stand between the start and kubelet seeing the resources; without
        registrations, it makes it a poll interval after the start)."""
        if self._config_watcher is not None:
            self._config_watcher.watch_events()

    def _on_config_file_changed(self) -> None:
        self.reload("config file changed")

    def stop(self) -> None:
        log.info("stopping")
        if self.nvml is not None and self.nvml.calls is not None:
            # No thread waits out an NVML deadline on the way out (a GPU in a reset would hold the stop
            # past kubelet's grace period): calls in flight, and later ones, fail at once from here on.
            self.nvml.calls.stop_waiting()
        self.workers.stop_all()
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self.nvml is not None:
            self.nvml.close()
        log.info("stopped")

    # ---- probes -----------------------------------------------------------------------------

    def liveness(self) -> str | None:
        """None while the process does its job; else why the liveness probe should restart it.

        A worker whose thread ended with an error (a bug: every loop catches what it expects) no longer
        does its job, and the registrar can stall the node for good (a dead thread or a registration that
        never lands): the liveness probe restarts the pod then. A node without resources to serve is live.
        """
        if dead := self.workers.failures():
            return "; ".join(f"thread {name} ended: {why}" for name, why in sorted(dead.items()))
        if not self.manager.served():
            return None
        return self.manager.health()

    def readiness(self) -> str | None:
        """None when every served resource is registered with kubelet; otherwise what is missing."""
        manager = self.manager
        if (problem := self.cdi_problem) is not None:
            return f"not ready: {problem}; retrying with backoff"
        if self._cdi_retrying is not None:
            return (
                f"not ready: {self._cdi_retrying}; still serving the previous config, retrying with backoff"
            )
        if (dra := self.dra.problem()) is not None:
            return f"not ready: DRA: {dra}"
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
        return self.reloads.reload(reason)

    def _edit_inventory(self, reason: str, change: InventoryEdit) -> bool:
        """Serve the inventory as `change` makes it (a GPU dynamic MIG changed, read again): follower.edit."""
        return self.reloads.edit(reason, change)

    def _apply_reload(self, snapshot: Snapshot, old: Snapshot) -> None:
        """Serve `snapshot` in place of `old` (the follower holds its lock)."""
        if self._cdi_retrying is not None:
            log.info("CDI specs can be made again; serving resources")
        self._cdi_retrying = None
        self._announce(snapshot, old)
        mark_lost_on_reload(self.registry, snapshot.inventory)
        self._serve(snapshot)
        bring_back_rediscovered(self.registry, snapshot.inventory)
        if snapshot.config.health != old.config.health or snapshot.inventory != old.inventory:
            self._watch_health(snapshot)

    def _announce(self, snapshot: Snapshot, old: Snapshot | None) -> None:
        """The lines of a start or reload (announce.py): the config and why (at start it was logged when
        read), the resources and their counts, each warning once while it lasts, and the debug decisions."""
        if old is not None:
            log.info("%s", config_line(snapshot.config))
        current = notices(snapshot)
        for notice in current:
            self._discovery.report(notice.key, notice.message, notice.level)
        for gone in self._noticed - {n.key for n in current}:
            self._discovery.clear(gone)  # logged again should it come back
        self._noticed = {n.key for n in current}
        log.info("%s", resources_line(snapshot))
        for violation in snapshot.mig_violations:
            self.metrics.mig_strategy_violation(violation.gpu_uuid, violation.strategy)
        if log.isEnabledFor(logging.DEBUG):
            for line in decisions(snapshot):
                log.debug("%s", line)
        if old is None or old.allocation.imex_channel_ids != snapshot.allocation.imex_channel_ids:
            log.info("%s", imex_summary(snapshot.allocation))

    # ---- internals --------------------------------------------------------------------------

    def _servable(self, snapshot: Snapshot) -> Snapshot:
        """`snapshot` with its CDI specs written, unless its config asks for what this node cannot give.

        Required IMEX channels missing: a ConfigError. CDI specs that cannot be made or written: on a
        reload a CdiError, so the previous snapshot (and its specs) keep serving and the follower retries
        with backoff; at start the daemon serves nothing, says why, and retries (`_start_serving`).
        """
        self._cdi_retrying = None  # until this snapshot's specs are known not to work
        problem = imex_problem(snapshot.allocation)
        if problem is not None:
            raise ConfigError(problem)
        first = self.snapshot is None
        cdi_problem = snapshot.cdi.problem if snapshot.cdi is not None else None
        if cdi_problem is None or first:
            cdi_problem = self._publish_cdi(snapshot.cdi)
        if cdi_problem is not None and not first:
            self._cdi_retrying = cdi_problem
            raise CdiError(cdi_problem)
        return snapshot

    def _serve(self, snapshot: Snapshot) -> None:
        self._start_dra(snapshot)
        mps_gate = self._mps_readiness_for(snapshot)
        specs = {
            plan.name: ResourceSpec(
                plan.name,
                plan.socket_name,
                GpuResourceBackend(
                    plan,
                    snapshot.inventory,
                    snapshot.allocation,
                    self.registry,
                    mps_gate=mps_gate if sharing_mode(plan.sharing).needs_control_daemon else None,
                ),
            )
            for plan in self.dra.plugin_plans(snapshot)
        }
        # The specs were written (by _servable) before the servers see the new plans, so every name
        # Allocate returns is defined; when they cannot be made at start, no resource is served rather
        # than names no runtime resolves.
        if self.cdi_problem is not None:
            specs = {}
        self.snapshot = snapshot
        self.manager.apply(specs)
        if self.labels is not None:
            self.labels.notify()

    def _start_dra(self, snapshot: Snapshot) -> None:
        """The one point where the DRA side's workers (dra-slices, dra-handover, the kubelet DRA plugin) join
        the daemon's: when `snapshot` is the first to turn dra.enabled on."""
        for worker in self.dra.enable(snapshot, self.nvml):
            self.workers.start(worker)

    @property
    def cdi_problem(self) -> str | None:
        """Why the CDI specs of the served snapshot could not be written at start; None when they were (or
        no snapshot has had CDI specs)."""
        return self._cdi.problem if self._cdi is not None else None

    def _publish_cdi(self, plan: CdiPlan | None) -> str | None:
        """Write `plan`'s specs (None: keep only the names kubelet's checkpoint holds); why not, when they
        cannot be. The publisher is made for the first plan: until then nothing of ours is in a spec
        directory, so a node that never used a CDI strategy neither loads it nor reads the checkpoint."""
        if self._cdi is None:
            if plan is None:
                return None
            from nvidia_device_plugin.cdi.retention import CHECKPOINT_FILE
            from nvidia_device_plugin.cdi.writer import CdiPublisher

            self._cdi = CdiPublisher(self.options.plugin_dir / CHECKPOINT_FILE)
        return self._cdi.publish(plan)

    def _mps_readiness_for(self, snapshot: Snapshot) -> MpsReadinessWatcher | None:
        """The MPS readiness watcher, reading `snapshot`'s MPS replicas' GPUs now, before their lists are
        served, so the first list is already right. Made, its thread joining the daemon's workers, when a
        snapshot first serves MPS: a node that never does neither loads it nor runs its thread."""
        mps = [p for p in snapshot.plans if sharing_mode(p.sharing).needs_control_daemon]
        if self._mps_readiness is None:
            if not mps:
                return None
            from nvidia_device_plugin.sharing.readiness import DEFAULT_POLL_INTERVAL_S, MpsReadinessWatcher

            interval = self.options.mps_poll_interval_s
            self._mps_readiness = MpsReadinessWatcher(
                self._on_mps_readiness_change, DEFAULT_POLL_INTERVAL_S if interval is None else interval
            )
            self.workers.start(self._mps_readiness)
        pairs = [(p.name, uuid) for p in mps for uuid in shared_devices(p)]
        self._mps_readiness.watch(snapshot.config.flags.mps_root, pairs)
        return self._mps_readiness

    def _on_dra_owners_changed(self) -> None:
        """A GPU changed sides (on the handover thread): serve the device plugin's lists again."""
        with self.reloads.lock:
            if self.snapshot is not None:
                self._serve(self.snapshot)

    def _watch_health(self, snapshot: Snapshot) -> None:
        """A health monitor for `snapshot`, in place of the previous one (which stops first)."""
        assert self.nvml is not None
        monitor = HealthMonitor(
            self.nvml.nv, snapshot.inventory, snapshot.config.health, self.registry, events=self.metrics
        )
        self.workers.replace(self._monitor, monitor)
        self._monitor = monitor

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
        """The one log line per health change (at most 5 per device in 10 s: a flapping GPU makes thousands),
        and a ListAndWatch push where it matters (coalesced by the stream, see plugin/streams.py)."""
        self.metrics.health_changed(change)
        self.dra.on_health_change(change)  # taints the DRA device (or lifts its taint)
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
            self._health_lines.log(
                change.uuid,
                logging.INFO,
                "%s is healthy again (%s); resources affected: %s",
                where,
                change.reason,
                ", ".join(affected) or "none",
            )
        else:
            self._health_lines.log(
                change.uuid,
                logging.WARNING,
                "%s is unhealthy: %s; resources affected: %s",
                where,
                change.reason,
                ", ".join(affected) or "none",
            )
        for name in affected:
            self.manager.notify(name)

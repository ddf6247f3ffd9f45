"""The daemon's part of the DRA mode (dra/mode.py), kept out of daemon.py: check a snapshot's `dra`
section before it is served, make the mode when a config first turns it on, serve the device plugin only
the GPUs it owns, and serve again when a GPU changes sides. `Daemon` mixes this in."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from nvidia_device_plugin.base.errors import ConfigError

# Every Daemon inherits this class, DRA on or off: what only the DRA mode uses is imported where it is
# made (dra.mode pulls the DRA and Kubernetes API modules), so a daemon with DRA off never loads it.
if TYPE_CHECKING:
    from nvidia_device_plugin.base.workers import WorkerGroup
    from nvidia_device_plugin.dra.mode import DraMode
    from nvidia_device_plugin.dra.options import DraOptions
    from nvidia_device_plugin.health.registry import HealthRegistry
    from nvidia_device_plugin.nvml.session import NvmlSession
    from nvidia_device_plugin.plans.resources import ResourcePlan
    from nvidia_device_plugin.snapshot import Snapshot, SnapshotFollower

log = logging.getLogger(__name__)


class _Options(Protocol):
    @property
    def dra(self) -> DraOptions | None: ...


class DraWiring:
    options: _Options
    dra: DraMode | None
    registry: HealthRegistry
    workers: WorkerGroup
    nvml: NvmlSession | None
    snapshot: Snapshot | None
    reloads: SnapshotFollower

    def _serve(self, snapshot: Snapshot) -> None:
        raise NotImplementedError  # the Daemon's

    def check_dra(self, snapshot: Snapshot) -> Snapshot:
        """`snapshot`, unless its dra section cannot be served here (refused, the last good one stays)."""
        if snapshot.config.dra.enabled:
            from nvidia_device_plugin.dra.ownership import wanted_owners

            if self.options.dra is None or not self.options.dra.node_name:
                raise ConfigError(
                    "dra.enabled needs this node's name (set NODE_NAME from the downward API, or --node-name)"
                )
            wanted_owners(snapshot.inventory, snapshot.config.dra)  # a GPU ref this node lacks is refused
        return snapshot

    def _plugin_plans(self, snapshot: Snapshot) -> tuple[ResourcePlan, ...]:
        """The plans the device plugin serves: all of them, or (DRA on) those of the GPUs it owns now."""
        options = self.options.dra
        if self.dra is None and snapshot.config.dra.enabled and options is not None:
            from nvidia_device_plugin.dra.mode import DraMode

            self.dra = DraMode(
                options,
                self.registry.verdicts,
                self._on_dra_owners_changed,
                host=self.nvml.host if self.nvml is not None else None,
                cdi_spec_dir=Path(snapshot.config.flags.plugin.cdi_spec_dir),
            )
            log.info("DRA mode on: driver gpu.nvidia.com, pool %s", options.node_name)
            for worker in self.dra.workers():
                self.workers.start(worker)
        if self.dra is None:
            return snapshot.plans
        self.dra.serve(snapshot)
        return self.dra.plugin_plans(snapshot.plans)

    def dra_problem(self) -> str | None:
        """Why the DRA mode cannot serve kubelet now (its kubelet plugin's sockets); None when it can."""
        return self.dra.kubelet.health() if self.dra is not None else None

    def _on_dra_owners_changed(self) -> None:
        """A GPU changed sides (on the handover thread): serve the device plugin's lists again."""
        with self.reloads.lock:
            if self.snapshot is not None:
                self._serve(self.snapshot)

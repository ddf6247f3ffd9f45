"""The `run` daemon's DRA side: the one object the daemon asks about DRA, whether DRA is on or not.

The daemon owns one `DraSide` and asks it five things: `check` a snapshot's `dra` section before it is
served; `enable` the DRA mode when a config first turns `dra.enabled` on (the mode's workers come back, for
the daemon to start at one named point with its others); the `plugin_plans` the device plugin serves (all of
them, or with DRA on those of the GPUs it owns now); the `problem` that keeps the node from being ready;
and each health change (`on_health_change`, which taints DRA devices). While DRA was never turned on it
holds no mode: no API client, no slices, no kubelet plugin.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.base.workers import Worker
from nvidia_device_plugin.dra.options import DraOptions
from nvidia_device_plugin.events import HealthChange
from nvidia_device_plugin.health.registry import Verdict
from nvidia_device_plugin.plans.resources import ResourcePlan
from nvidia_device_plugin.snapshot import Snapshot

if TYPE_CHECKING:  # the mode's modules load only when a config turns DRA on (start-up cost)
    from nvidia_device_plugin.dra.mode import DraMode, InventoryEditor
    from nvidia_device_plugin.nvml.session import NvmlSession

log = logging.getLogger(__name__)


class DraSide:
    def __init__(
        self,
        options: DraOptions | None,
        verdicts: Callable[[], Mapping[str, Verdict]],
        on_owners_changed: Callable[[], None],
        edit_inventory: InventoryEditor | None = None,
    ) -> None:
        """`options`: where the DRA mode finds the node's kubelet and API (None: DRA cannot be turned on
        here); `verdicts`: the health registry's verdicts now (the mode's taints start from them);
        `on_owners_changed`: called (on the handover thread) when a GPU changed sides; `edit_inventory`: the
        daemon's reload funnel, told each GPU dynamic MIG changed (read again) so the served snapshot
        follows."""
        self.options = options
        self._verdicts = verdicts
        self._on_owners_changed = on_owners_changed
        self._edit_inventory = edit_inventory
        self.mode: DraMode | None = None  # made when a config first turns dra.enabled on (`enable`)

    def check(self, snapshot: Snapshot) -> Snapshot:
        """`snapshot`, unless its dra section cannot be served here (refused, the last good one stays)."""
        if snapshot.config.dra.enabled:
            if self.options is None or not self.options.node_name:
                raise ConfigError(
                    "dra.enabled needs this node's name (set NODE_NAME from the downward API, or --node-name)"
                )
            from nvidia_device_plugin.dra.ownership import wanted_owners

            wanted_owners(snapshot.inventory, snapshot.config.dra)  # a GPU ref this node lacks is refused
        turned_off = not (snapshot.config.dra.enabled and snapshot.config.dra.dynamic_mig)
        was_on = self.mode is not None and self.mode.dynamic_mig()
        made = self.mode.kubelet.made_mig() if self.mode is not None and was_on and turned_off else {}
        if made:  # what made them must stay on to destroy them at unprepare
            claims = "; ".join(f"{label}: {', '.join(uuids)}" for label, uuids in sorted(made.items()))
            raise ConfigError(
                f"dra.dynamicMig cannot be turned off while claims hold MIG devices it made ({claims}); "
                "delete their pods first"
            )
        return snapshot

    def enable(self, snapshot: Snapshot, nvml: NvmlSession | None) -> list[Worker]:
        """The DRA mode's workers, the first time a snapshot turns `dra.enabled` on; else none (the mode,
        once made, stays: turning DRA off hands the GPUs back through its handover). `nvml`: the daemon's
        session (its host paths, the GPUs' compute modes and time-slices that claims' sharing sets)."""
        if self.mode is not None or not snapshot.config.dra.enabled or self.options is None:
            return []
        from nvidia_device_plugin.dra.mode import DraMode

        self.mode = DraMode(
            self.options,
            self._verdicts,
            self._on_owners_changed,
            nvml=nvml,
            cdi_spec_dir=Path(snapshot.config.flags.plugin.cdi_spec_dir),
            mps_root=snapshot.config.flags.mps_root,
            edit_inventory=self._edit_inventory,
        )
        log.info("DRA mode on: driver gpu.nvidia.com, pool %s", self.options.node_name)
        return self.mode.workers()

    def plugin_plans(self, snapshot: Snapshot) -> tuple[ResourcePlan, ...]:
        """The plans the device plugin serves: all of them, or (DRA on) those of the GPUs it owns now, once
        the DRA mode has taken `snapshot`'s owners."""
        if self.mode is None:
            return snapshot.plans
        self.mode.serve(snapshot)
        return self.mode.plugin_plans(snapshot.plans)

    def problem(self) -> str | None:
        """Why the DRA mode cannot serve kubelet now (its kubelet plugin's sockets); None when it can."""
        return self.mode.kubelet.health() if self.mode is not None else None

    def on_health_change(self, change: HealthChange) -> None:
        """Taint the DRA device `change` takes down (or lift its taint)."""
        if self.mode is not None:
            self.mode.on_health_change(change)

    def owners(self) -> dict[str, str]:
        """GPU UUID -> its side now, or "moving to <side>" (empty while DRA was never on)."""
        return self.mode.owners() if self.mode is not None else {}

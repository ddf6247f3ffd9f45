"""`nvidia-device-plugin mps-control-daemon`: the MPS servers of a node, run apart from the device plugin.

It runs as its own DaemonSet (manifests/mps-control-daemon/), with what MPS needs and the plugin does not:
hostPID, the MPS root (pipes, logs, shared memory) and CAP_SYS_ADMIN to set compute modes. It reads the
same config as `run` (same flags, env, file or ConfigMap directory, live reload), builds the same snapshot,
and for every GPU an MPS plan shares:

1. sets the GPU's compute mode to EXCLUSIVE_PROCESS, so that a process that ignores
   CUDA_MPS_PIPE_DIRECTORY cannot open the GPU beside the MPS server (and outside its limits);
2. starts one `nvidia-cuda-mps-control -d` with CUDA_VISIBLE_DEVICES=<that GPU> and sets the per-client
   pinned-memory and thread limits as the daemon's defaults (sharing/mps_daemon.py);
3. publishes the GPU's readiness in <mpsRoot>/<resource>/<gpu-uuid>/status.json (sharing/readiness.py),
   which the plugin reads before it advertises the GPU's replicas as Healthy.

Lifecycle. A config change that keeps a GPU shared keeps its daemon (and every client) running. A GPU no
longer shared with MPS (MPS -> time-slicing, a smaller `devices` list) gets `quit`, its status file
withdrawn and its compute mode set back to DEFAULT; that is the only time a daemon is quit. SIGTERM stops
this command and leaves the daemons running, so a rolling update of this DaemonSet does not end a single
client; the next start adopts them through their pid files. To end MPS on a node, remove it from the
config first, then the DaemonSet.

Reloads go through follower.SnapshotFollower, as the plugin's do: a GPU NVML can no longer open is carried
over as lost (so its daemon is kept, not quit), a reload NVML made fail is retried with backoff, and any
error keeps the daemons of the last good config, and a GPU lost at start that reads again is re-discovered
(its daemon then gets the pinned-memory limit its memory allows; none is set while that is unknown). Its
workers, in start order: the config watch, the reload retry, the re-discovery, then (once the first
snapshot is applied) the supervisor; stopped in reverse.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from nvidia_device_plugin.base.errors import NvmlError
from nvidia_device_plugin.base.workers import WorkerGroup
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.config.watch import ConfigWatcher
from nvidia_device_plugin.daemons.follower import (
    REDISCOVERY_INTERVAL_S,
    RELOAD_RETRY_MAX_S,
    RELOAD_RETRY_MIN_S,
    SnapshotFollower,
)
from nvidia_device_plugin.nvml.compute_mode import ComputeMode, set_compute_mode
from nvidia_device_plugin.nvml.session import NvmlSession
from nvidia_device_plugin.sharing import CONTROL_EXECUTABLE, QUIT_TIMEOUT_S
from nvidia_device_plugin.sharing.mps_daemon import MpsDaemonSpec, MpsDaemonSupervisor, daemon_specs
from nvidia_device_plugin.snapshot import Snapshot

log = logging.getLogger(__name__)


@dataclass
class ControlDaemonOptions:
    load_config: Callable[[], Config]  # resolves file + env + flags afresh; raises ConfigError
    open_nvml: Callable[[], NvmlSession]  # raises NvmlError on a node without a usable driver
    watch: Callable[[Callable[[], None]], ConfigWatcher] | None = None
    control_path: str = CONTROL_EXECUTABLE
    quit_timeout_s: float = QUIT_TIMEOUT_S
    check_interval_s: float = 1.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    rediscovery_interval_s: float = REDISCOVERY_INTERVAL_S  # how often GPUs held as lost are read again
    # A reload NVML (or CDI) made fail is retried after reload_retry_min_s, doubling to reload_retry_max_s.
    reload_retry_min_s: float = RELOAD_RETRY_MIN_S
    reload_retry_max_s: float = RELOAD_RETRY_MAX_S


class MpsControlDaemon:
    """The long-running part of `mps-control-daemon`: config -> wanted MPS daemons -> the supervisor."""

    def __init__(self, options: ControlDaemonOptions) -> None:
        self.options = options
        self.nvml: NvmlSession | None = None
        self.snapshot: Snapshot | None = None
        self.supervisor = MpsDaemonSupervisor(
            control_path=options.control_path,
            prepare=self._set_exclusive,
            release=self._set_default,
            check_interval_s=options.check_interval_s,
            quit_timeout_s=options.quit_timeout_s,
            backoff_initial_s=options.backoff_initial_s,
            backoff_max_s=options.backoff_max_s,
        )
        self.reloads = SnapshotFollower(
            options.load_config,
            self._apply_reload,
            kept="MPS daemons unchanged",
            rediscovery_interval_s=options.rediscovery_interval_s,
            retry_min_s=options.reload_retry_min_s,
            retry_max_s=options.reload_retry_max_s,
        )
        self.workers = WorkerGroup()
        if options.watch is not None:
            self.workers.add(options.watch(self._on_config_file_changed))
        self.workers.add(self.reloads.retry)
        self.workers.add(self.reloads.rediscovery)  # a GPU lost at start comes back with its real limits

    def start(self) -> None:
        """Start supervising. Raises ConfigError / NvmlError / InventoryError when nothing sane can run."""
        log.info("mps-control-daemon starting (control binary %s)", self.options.control_path)
        self.workers.start_all()  # the watch first: an edit during start-up waits for the lock, then lands
        with self.reloads.lock:
            config = self.options.load_config()
            self.nvml = self.options.open_nvml()
            self._apply(self.reloads.first(self.nvml, config))
        self.workers.start(self.supervisor)

    def reload(self, reason: str) -> bool:
        """Apply the current config; on any error keep the daemons of the last good one. True when applied."""
        return self.reloads.reload(reason)

    def _on_config_file_changed(self) -> None:
        self.reload("config file changed")

    def stop(self) -> None:
        """Stop this command; the MPS control daemons keep running for their clients (see the module doc)."""
        log.info("mps-control-daemon stopping; MPS control daemons are left running for their clients")
        self.workers.stop_all()
        if self.nvml is not None:
            self.nvml.close()
        log.info("mps-control-daemon stopped")

    def _apply_reload(self, snapshot: Snapshot, old: Snapshot) -> None:
        self._apply(snapshot)

    def _apply(self, snapshot: Snapshot) -> None:
        mps_root = snapshot.config.flags.mps_root
        specs = [spec for plan in snapshot.plans for spec in daemon_specs(plan, mps_root)]
        self.snapshot = snapshot
        log.info(
            "MPS wanted on %d GPUs%s (MPS root %s)",
            len(specs),
            "".join(f"; {s.label}" for s in specs[:8]) + ("; ..." if len(specs) > 8 else ""),
            mps_root,
        )
        self.supervisor.update(specs)

    # ---- compute mode (runs on the supervisor's thread, or in a reload for a GPU given back) ----------

    def _set_exclusive(self, spec: MpsDaemonSpec) -> None:
        self._set_compute_mode(spec, "EXCLUSIVE_PROCESS")

    def _set_default(self, spec: MpsDaemonSpec) -> None:
        self._set_compute_mode(spec, "DEFAULT")

    def _set_compute_mode(self, spec: MpsDaemonSpec, mode: ComputeMode) -> None:
        if self.nvml is None:
            raise NvmlError("NVML is not open")
        set_compute_mode(self.nvml.nv, spec.gpu_uuid, mode)

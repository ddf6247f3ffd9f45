"""What a claim's opaque config makes of its GPUs at Prepare, and undoing it at Unprepare.

`plan_sharing` turns a claim's results and configs (dra/kubelet/opaque.py) into one PreparedSharing per
physical GPU the config touches, refusing (ClaimError) what cannot be done: two configs asking one GPU for
different sharing, MPS on a MIG device (as the device plugin and NVIDIA refuse it: sharing_modes says which
modes share MIG devices), and MPS across GPUs (this plugin runs one control daemon per GPU, and a container
has one pipe directory). `refuse_conflicts` refuses a claim asking a GPU for sharing other than what a claim
prepared there already set up (a different interval), and any two claims on one GPU when either is MPS (its
control daemon holds the GPU). `refuse_config_mps` refuses any sharing a claim asks of a GPU that the node's
config shares through MPS (`sharing.mps`, `config_sharing_of` finds them in the plans): the separate
mps-control-daemon runs a control daemon there and sets the GPU's compute mode to EXCLUSIVE_PROCESS, not
knowing which GPUs DRA owns, so a claim's MPS would start a second daemon (and its release set the compute
mode back to DEFAULT under the config's), and a claim's time-slice would change under the MPS clients.
A claim without sharing config on such a GPU is one of that daemon's clients instead (`config_mps_edits`),
as a container of its replicas is to the device plugin.

`ClaimSharing` carries it out. TimeSlicing on a whole GPU sets the GPU's time-slice (nvml/timeslice.py); on
a MIG device there is nothing to set. MPS starts one control daemon per claim, with its own pipe and log
directories under `<mps_root>/claims/<claim UID>/`, through the device plugin's own supervisor
(sharing/mps_daemon.py: it adopts a daemon still running after a restart through the pid file in the pipe
directory, so a restarted plugin neither starts a second daemon nor leaks the first), and waits for it to
be ready before the claim is answered. The claim's CDI spec gets its client environment and mounts
(`mps_edits`). Unprepare quits the daemon (one no checkpoint entry names, too, found by its pid file) and
removes the claim's directories. Time-slices are not set back (nor does NVIDIA's driver).
"""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from nvidia_device_plugin.base.errors import NvmlError
from nvidia_device_plugin.config.sharing_modes import sharing_mode
from nvidia_device_plugin.dra.kubelet.claims import AllocationResult
from nvidia_device_plugin.dra.kubelet.model import ClaimError, ClaimRef, ConfigSharing, PreparedSharing
from nvidia_device_plugin.dra.kubelet.opaque import DeviceSharing, OpaqueConfig, sharing_of
from nvidia_device_plugin.dra.names import DraDevice
from nvidia_device_plugin.nvml.timeslice import TimeSliceControl, TimeSliceInterval
from nvidia_device_plugin.plans.resources import ResourcePlan
from nvidia_device_plugin.sharing import CONTROL_EXECUTABLE, QUIT_TIMEOUT_S, mps
from nvidia_device_plugin.sharing.mps import CONTAINER_SHM_DIR, host_shm_dir
from nvidia_device_plugin.sharing.mps_daemon import MpsDaemonSpec, MpsDaemonSupervisor
from nvidia_device_plugin.sharing.mps_processes import (
    QuitTarget,
    is_control_daemon,
    quit_daemons,
    running_pid,
)
from nvidia_device_plugin.sharing.readiness import STATUS_FILE, read_status, status_path

log = logging.getLogger(__name__)

MPS_READY_TIMEOUT_S = 20.0  # a claim's control daemon must be ready within this; kubelet waits 45 s in all
CONTAINER_MPS_ROOT = "/mps/claims"  # a container sees claim <UID>'s pipe and log under <this>/<UID>/
_DEFAULT_THREAD_PERCENTAGE = 100  # what the control daemon gives a client when no default is set
_POLL_S = 0.05


def plan_sharing(
    results: Sequence[AllocationResult], configs: Sequence[OpaqueConfig], devices: Mapping[str, DraDevice]
) -> tuple[PreparedSharing, ...]:
    """One PreparedSharing per physical GPU that a config applies to, in result order."""
    asked: dict[str, tuple[DeviceSharing, str]] = {}  # GPU UUID -> (sharing, the device that asked)
    for result in results:
        device = devices[result.device]
        sharing = sharing_of(
            configs, result.request, result.subrequest or result.request, device.name, device.mig is not None
        )
        if sharing is None:
            continue
        if device.mig is not None and not sharing.mode.shares_mig_devices:
            raise ClaimError(f"{sharing.where}: {sharing.mode.name} cannot share MIG device {device.name}")
        before = asked.setdefault(device.gpu.uuid, (sharing, device.name))
        if before[0] != sharing:
            who = (
                f"device {device.name} is"
                if before[1] == device.name
                else f"devices {before[1]} and {device.name} (on GPU {device.gpu.uuid}) are"
            )
            raise ClaimError(
                f"{who} asked {before[0].describe()} ({before[0].where}) and {sharing.describe()} "
                f"({sharing.where}); one GPU is shared one way"
            )
    mps = [uuid for uuid, (s, _) in asked.items() if s.mode.needs_control_daemon]
    if len(mps) > 1:
        raise ClaimError(
            f"MPS is asked for devices on {len(mps)} GPUs ({', '.join(mps)}); a claim's MPS devices must be "
            "on one GPU (one control daemon per GPU, one pipe directory per container)"
        )
    return tuple(_prepared(uuid, sharing) for uuid, (sharing, _) in asked.items())


def _prepared(gpu_uuid: str, sharing: DeviceSharing) -> PreparedSharing:
    if sharing.mps is None:
        return PreparedSharing(gpu_uuid, sharing.mode.name, sharing.interval)
    limit = sharing.mps.pinned_limit_for(0, gpu_uuid)
    known = {"0", gpu_uuid}
    stray = sorted(key for key, _ in sharing.mps.per_device_pinned_memory_limit_mib if key not in known)
    if stray:
        raise ClaimError(
            f"{sharing.where}: defaultPerDevicePinnedMemoryLimit names {', '.join(stray)}, no MPS device of "
            f"this claim (use 0 or {gpu_uuid})"
        )
    return PreparedSharing(gpu_uuid, sharing.mode.name, None, sharing.mps.active_thread_percentage, limit)


@dataclass(frozen=True)
class GpuHolder:
    """A claim prepared (or being prepared) here, as conflicts are judged: the GPUs it holds, its sharing."""

    ref: ClaimRef
    gpus: frozenset[str]  # physical GPU UUIDs of its devices
    sharing: tuple[PreparedSharing, ...]


def refuse_conflicts(
    gpus: Iterable[str], wanted: Sequence[PreparedSharing], others: Iterable[GpuHolder]
) -> None:
    """ClaimError when a GPU of `gpus` is held by another claim that set up different sharing on it, or
    when either claim is MPS there: an MPS claim's GPU is its own (its daemon holds the GPU)."""
    mine = {s.gpu_uuid: s for s in wanted}
    for other in others:
        theirs = {s.gpu_uuid: s for s in other.sharing}
        for gpu in sorted(set(gpus) & (other.gpus | theirs.keys())):
            asked, set_up = mine.get(gpu), theirs.get(gpu)
            daemon = any(s is not None and sharing_mode(s.mode).needs_control_daemon for s in (asked, set_up))
            if daemon or (asked is not None and set_up is not None and asked != set_up):
                raise ClaimError(
                    f"GPU {gpu} is {_held(set_up)} by {other.ref.label}; this claim asks "
                    f"{_describe(asked) if asked else 'no sharing'}"
                    + ("; an MPS claim's GPU is its own" if daemon else "")
                )


def config_sharing_of(plans: Iterable[ResourcePlan]) -> dict[str, ConfigSharing]:
    """The GPUs (by UUID) whose replicas the config's plans advertise, and how they are shared: the GPUs
    mps-control-daemon runs a control daemon on are those of MPS plans (sharing/mps_specs.daemon_specs)."""
    shared: dict[str, ConfigSharing] = {}
    for plan in plans:
        mode = sharing_mode(plan.sharing)
        for device in plan.devices:
            if mode.shares_devices and device.replica is not None:
                shared.setdefault(
                    device.gpu_uuid, ConfigSharing(mode, plan.name, plan.replicas, device.memory_bytes)
                )
    return shared


def config_mps_edits(
    results: Sequence[AllocationResult],
    devices: Mapping[str, DraDevice],
    config_sharing: Mapping[str, ConfigSharing],
    claim_mps: Sequence[PreparedSharing],
    mps_root: str | None,
) -> dict[str, Any]:
    """The CDI containerEdits of a claim whose devices are on a GPU the node's config shares through MPS:
    what the device plugin's Allocate gives a container of one replica (sharing/mps.py, the same code),
    or of as many as the shares the claim consumed: the pipe and log of mps-control-daemon's control
    daemon for the GPU, shm, and the replicas' thread and memory limits. ClaimError when that daemon is not
    ready (its status file, sharing/readiness.py), or where a container would need two pipe directories."""
    shares: dict[str, int] = {}
    for result in results:
        gpu = devices[result.device].gpu.uuid
        config = config_sharing.get(gpu)
        if config is not None and config.mode.needs_control_daemon:
            shares[gpu] = shares.get(gpu, 0) + (result.shares or 1)
    if not shares:
        return {}
    if len(shares) > 1 or claim_mps:
        gpus = sorted(shares) + [s.gpu_uuid for s in claim_mps]
        raise ClaimError(
            f"devices on GPUs {', '.join(gpus)} are each MPS clients of a different control daemon; a "
            "claim's MPS devices must be on one GPU (a container has one pipe directory)"
        )
    ((gpu, count),) = shares.items()
    config = config_sharing[gpu]
    where = (
        f"GPU {gpu} is shared through MPS by this node's config ({config.mode.section}, resource "
        f"{config.resource})"
    )
    if mps_root is None:
        raise ClaimError(f"{where}, and this plugin was started without the MPS root its clients need")
    status = read_status(status_path(mps_root, config.resource, gpu))
    if not status.ready:
        raise ClaimError(f"{where}, whose control daemon is not ready: {status.reason}")
    env = mps.client_envs(config.resource, config.memory_bytes, config.replicas, count)
    mounts = [
        {
            "hostPath": m.host_path,
            "containerPath": m.container_path,
            "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"],
        }
        for m in mps.client_mounts(config.resource, gpu, mps_root)
    ]
    return {"env": [f"{name}={value}" for name, value in env.items()], "mounts": mounts}


def refuse_config_mps(wanted: Sequence[PreparedSharing], config_sharing: Mapping[str, ConfigSharing]) -> None:
    """ClaimError when the claim asks sharing (any mode) of a GPU the node's config shares through MPS:
    mps-control-daemon's control daemon is on it, which a claim's daemon, compute mode or time-slice would
    break."""
    for asked in wanted:
        config = config_sharing.get(asked.gpu_uuid)
        if config is not None and config.mode.needs_control_daemon:
            raise ClaimError(
                f"GPU {asked.gpu_uuid} is shared through MPS by this node's config ({config.mode.section}, "
                f"resource {config.resource}), whose control daemon mps-control-daemon runs there; this "
                f"claim asks {_describe(asked)} of it, which would disturb that daemon's clients. Remove the "
                f"sharing config from the claim (or its DeviceClass), or the GPU from {config.mode.section}"
            )


def _held(sharing: PreparedSharing | None) -> str:
    return "held, with no sharing set up," if sharing is None else f"shared as {_describe(sharing)}"


def _describe(sharing: PreparedSharing) -> str:
    return sharing.mode + (f" (interval {sharing.interval})" if sharing.interval else "")


def claim_mps_dir(mps_root: str, claim_uid: str) -> str:
    return posixpath.join(mps_root, "claims", claim_uid)


def daemon_spec(mps_root: str, claim_uid: str, sharing: PreparedSharing) -> MpsDaemonSpec:
    """Claim `claim_uid`'s control daemon on its GPU."""
    root = claim_mps_dir(mps_root, claim_uid)
    return MpsDaemonSpec(
        resource_name=f"claim {claim_uid}",
        gpu_uuid=sharing.gpu_uuid,
        pipe_dir=posixpath.join(root, "pipe"),
        log_dir=posixpath.join(root, "log"),
        status_path=posixpath.join(root, STATUS_FILE),
        pinned_memory_limit_mib=sharing.pinned_memory_limit_mib or 0,
        active_thread_percentage=(
            _DEFAULT_THREAD_PERCENTAGE
            if sharing.active_thread_percentage is None
            else sharing.active_thread_percentage
        ),
    )


def mps_edits(mps_root: str, claim_uid: str, sharing: Sequence[PreparedSharing]) -> dict[str, Any]:
    """The CDI containerEdits of a claim's MPS client: its daemon's pipe, log and shared memory."""
    mps = next((s for s in sharing if sharing_mode(s.mode).needs_control_daemon), None)
    if mps is None:
        return {}
    spec = daemon_spec(mps_root, claim_uid, mps)
    pipe, logs = (posixpath.join(CONTAINER_MPS_ROOT, claim_uid, name) for name in ("pipe", "log"))
    env = [f"CUDA_MPS_PIPE_DIRECTORY={pipe}", f"CUDA_MPS_LOG_DIRECTORY={logs}"]
    if mps.active_thread_percentage is not None:
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={mps.active_thread_percentage}")
    if mps.pinned_memory_limit_mib is not None:
        env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={mps.pinned_memory_limit_mib}M")
    bind = ["rw", "nosuid", "nodev", "bind"]
    mounts = [
        {"hostPath": spec.pipe_dir, "containerPath": pipe, "options": bind},
        {"hostPath": spec.log_dir, "containerPath": logs, "options": ["ro", "nosuid", "nodev", "bind"]},
        {"hostPath": host_shm_dir(mps_root), "containerPath": CONTAINER_SHM_DIR, "options": bind},
    ]
    return {"env": env, "mounts": mounts}


class ClaimSharing:
    """Sets claims' sharing up on the node: time-slices through `time_slice`, MPS control daemons under
    `mps_root` (the same path on the host and here) run with `control_path`. `prepare_gpu` and
    `release_gpu` are the supervisor's hooks around a daemon (e.g. the compute mode); `close()` stops the
    supervision and leaves the daemons running for a successor."""

    def __init__(
        self,
        *,
        time_slice: TimeSliceControl,
        mps_root: str,
        control_path: str = CONTROL_EXECUTABLE,
        prepare_gpu: Callable[[MpsDaemonSpec], None] = lambda spec: None,
        release_gpu: Callable[[MpsDaemonSpec], None] = lambda spec: None,
        ready_timeout_s: float = MPS_READY_TIMEOUT_S,
        base_env: Mapping[str, str] | None = None,
        check_interval_s: float = 1.0,
    ) -> None:
        self.mps_root = mps_root
        self._control_path = control_path
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._time_slice = time_slice
        self._ready_timeout_s = ready_timeout_s
        self._supervisor = MpsDaemonSupervisor(
            control_path=control_path,
            prepare=prepare_gpu,
            release=release_gpu,
            base_env=base_env,
            check_interval_s=check_interval_s,
            backoff_max_s=ready_timeout_s / 2,
        )
        self._wanted: dict[str, MpsDaemonSpec] = {}  # by claim UID
        self._lock = threading.Lock()

    def resume(self, claims: Iterable[tuple[str, Sequence[PreparedSharing]]]) -> None:
        """Supervise the daemons of claims prepared before a restart: running ones are adopted."""
        with self._lock:
            for uid, sharing in claims:
                for s in sharing:
                    if sharing_mode(s.mode).needs_control_daemon:
                        self._wanted[uid] = daemon_spec(self.mps_root, uid, s)
            if self._wanted:
                self._supervise()

    def apply(self, claim_uid: str, sharing: Sequence[PreparedSharing]) -> None:
        """Set up `sharing` for claim `claim_uid`: time-slices set, its control daemon ready."""
        for s in sharing:
            if s.interval is not None:
                self._set_time_slice(s.gpu_uuid, cast(TimeSliceInterval, s.interval))  # opaque.py checked it
            if sharing_mode(s.mode).needs_control_daemon:
                self._start_daemon(claim_uid, daemon_spec(self.mps_root, claim_uid, s))

    def release(self, claim_uid: str) -> None:
        """Quit claim `claim_uid`'s control daemon, if it has one (within the supervisor's quit bound), and
        remove its directories. A daemon no checkpoint entry knows (the checkpoint was set aside) is found
        through its pid file and quit as well. ClaimError when it still runs: kubelet unprepares again."""
        spec = daemon_spec(self.mps_root, claim_uid, PreparedSharing("", "mps"))
        with self._lock:
            if self._wanted.pop(claim_uid, None) is not None:
                self._supervisor.update(list(self._wanted.values()))
            elif (pid := running_pid(spec.pipe_dir)) is not None and is_control_daemon(
                pid, self._control_path, spec.pipe_dir
            ):
                log.warning(
                    "claim %s has a control daemon (pid %d) no checkpoint names; quitting it", claim_uid, pid
                )
                quit_daemons(
                    [QuitTarget(spec, pid)],
                    self._control_path,
                    self._base_env,
                    QUIT_TIMEOUT_S,
                    threading.Event(),
                )
        if (pid := running_pid(spec.pipe_dir)) is not None:
            raise ClaimError(
                f"the MPS control daemon of claim {claim_uid} (pid {pid}) did not quit; will retry"
            )
        root = claim_mps_dir(self.mps_root, claim_uid)
        try:
            shutil.rmtree(root)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove the MPS directories %s of claim %s: %s", root, claim_uid, exc)

    def close(self) -> None:
        self._supervisor.stop()

    def _set_time_slice(self, gpu_uuid: str, interval: TimeSliceInterval) -> None:
        try:
            self._time_slice.set_time_slice(gpu_uuid, interval)
        except NvmlError as exc:
            raise ClaimError(str(exc)) from None

    def _start_daemon(self, claim_uid: str, spec: MpsDaemonSpec) -> None:
        with self._lock:
            self._wanted[claim_uid] = spec
            self._supervise()
        deadline = time.monotonic() + self._ready_timeout_s
        reason = "not started yet"
        while time.monotonic() < deadline:
            status = self._supervisor.statuses().get(spec.gpu_uuid)
            if status is not None and status.ready:
                return
            reason = status.reason if status is not None else reason
            time.sleep(_POLL_S)
        self.release(claim_uid)
        raise ClaimError(
            f"the MPS control daemon for {spec.label} was not ready within "
            f"{self._ready_timeout_s:.0f}s: {reason}"
        )

    def _supervise(self) -> None:
        """Hand the wanted daemons to the supervisor (started on first use); holding self._lock."""
        if not self._supervisor.started:
            self._supervisor.start()
        self._supervisor.update(list(self._wanted.values()))
        self._supervisor.wake()

"""What one MPS control daemon is: the GPU it serves, its directories, and the client defaults it sets.

A GPU whose memory is not known (0: it was lost when it was read) gets no pinned-memory limit, as
NVIDIA's control daemon skips zero-memory devices: `set_default_device_pinned_mem_limit 0 0M` would
leave its clients no device memory at all. The limit is set once the GPU is read again (a reload
re-discovers it, and the supervisor sends the new defaults).
"""

from __future__ import annotations

from dataclasses import dataclass

from nvidia_device_plugin.config.sharing_modes import sharing_mode
from nvidia_device_plugin.plans.resources import ResourcePlan
from nvidia_device_plugin.sharing.mps import (
    active_thread_percentage,
    host_log_dir,
    host_pipe_dir,
    pinned_memory_limit_mib,
)
from nvidia_device_plugin.sharing.readiness import status_path


@dataclass(frozen=True)
class MpsDaemonSpec:
    """One control daemon: the shared GPU it serves and the limits it hands to its clients."""

    resource_name: str
    gpu_uuid: str
    pipe_dir: str
    log_dir: str
    status_path: str
    pinned_memory_limit_mib: int  # 0: the GPU's memory is unknown; no limit is set
    active_thread_percentage: int

    def env(self) -> dict[str, str]:
        return {
            "CUDA_VISIBLE_DEVICES": self.gpu_uuid,
            "CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir,
            "CUDA_MPS_LOG_DIRECTORY": self.log_dir,
        }

    def setup_commands(self) -> tuple[str, ...]:
        """Control commands that set the client defaults; device 0 is the only GPU the daemon sees."""
        memory = (
            (f"set_default_device_pinned_mem_limit 0 {self.pinned_memory_limit_mib}M",)
            if self.pinned_memory_limit_mib > 0
            else ()
        )
        return (*memory, f"set_default_active_thread_percentage {self.active_thread_percentage}")

    @property
    def label(self) -> str:
        return f"GPU {self.gpu_uuid} ({self.resource_name})"


def daemon_specs(plan: ResourcePlan, mps_root: str) -> tuple[MpsDaemonSpec, ...]:
    """One daemon per device that `plan` shares with MPS, in plan order; none for other plans."""
    if not sharing_mode(plan.sharing).needs_control_daemon:
        return ()
    specs: dict[str, MpsDaemonSpec] = {}
    for dev in plan.devices:
        if dev.replica is None or dev.physical_uuid in specs:
            continue
        replicas = plan.replicas
        specs[dev.physical_uuid] = MpsDaemonSpec(
            resource_name=plan.name,
            gpu_uuid=dev.physical_uuid,
            pipe_dir=host_pipe_dir(mps_root, plan.name, dev.physical_uuid),
            log_dir=host_log_dir(mps_root, plan.name, dev.physical_uuid),
            status_path=status_path(mps_root, plan.name, dev.physical_uuid),
            pinned_memory_limit_mib=pinned_memory_limit_mib(dev.memory_bytes, replicas),
            active_thread_percentage=active_thread_percentage(replicas),
        )
    return tuple(specs.values())

"""MPS's container contract: the paths, environment and mounts a client container of an MPS replica gets.

Host paths under `mps_root` (`flags.mpsRoot`, default /run/nvidia/mps), which must be the same path on the
host and in the plugin container:

    <mps_root>/<resource>/<gpu-uuid>/pipe   the daemon's CUDA_MPS_PIPE_DIRECTORY
    <mps_root>/<resource>/<gpu-uuid>/log    its CUDA_MPS_LOG_DIRECTORY
    <mps_root>/shm                          shared memory, seen as /dev/shm by the daemons and clients

The container sees what NVIDIA's plugin gives it: /mps/<resource>/pipe, /mps/<resource>/log (read-only),
and /dev/shm. Its limits are the GPU's memory and SMs split evenly among the replicas:
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=<memory / replicas, in MiB>M" and
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<100 // replicas>. A container holding n replicas of the GPU (allowed
with `failRequestsGreaterThanOne: false`) gets n shares: n x the memory, n x the percentage (at most 100).
The control daemons (sharing/mps_daemon.py, run by `mps-control-daemon`) get the one-replica values as
their defaults, so a client that drops these variables still gets one share, never more.

All of one container's MPS replicas must be on one GPU: it has one pipe directory per resource, and each
GPU has its own control daemon. GetPreferredAllocation keeps a multi-replica request on one GPU
(`single_gpu_preference`), and Allocate refuses one that spans GPUs.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from nvidia_device_plugin.api.v1beta1 import api_pb2
from nvidia_device_plugin.plans.resources import ResourcePlan

CONTAINER_ROOT = "/mps"
CONTAINER_SHM_DIR = "/dev/shm"
_MIB = 1024 * 1024


def host_pipe_dir(mps_root: str, resource_name: str, gpu_uuid: str) -> str:
    return posixpath.join(mps_root, resource_name, gpu_uuid, "pipe")


def host_log_dir(mps_root: str, resource_name: str, gpu_uuid: str) -> str:
    return posixpath.join(mps_root, resource_name, gpu_uuid, "log")


def host_shm_dir(mps_root: str) -> str:
    return posixpath.join(mps_root, "shm")


def container_pipe_dir(resource_name: str) -> str:
    return posixpath.join(CONTAINER_ROOT, resource_name, "pipe")


def container_log_dir(resource_name: str) -> str:
    return posixpath.join(CONTAINER_ROOT, resource_name, "log")


def pinned_memory_limit_mib(memory_bytes: int, replicas: int) -> int:
    """Each replica's share of the device memory, in whole MiB (rounded down)."""
    return memory_bytes // max(replicas, 1) // _MIB


def active_thread_percentage(replicas: int, shares: int = 1) -> int:
    """`shares` replicas' share of the SMs, in whole percent (rounded down, at least 1, at most 100)."""
    return min(max(100 // max(replicas, 1), 1) * max(shares, 1), 100)


def shared_devices(plan: ResourcePlan) -> tuple[str, ...]:
    """The physical devices `plan` advertises replicas of (`plan.replicas` each), in plan order.

    A plan may also hold devices its sharing entries did not select; those are unshared and left out.
    """
    return tuple(dict.fromkeys(d.physical_uuid for d in plan.devices if d.replica is not None))


def client_envs(resource_name: str, memory_bytes: int, replicas: int, shares: int = 1) -> dict[str, str]:
    """Environment for a container holding `shares` MPS replicas of a device with `memory_bytes`.

    A device whose memory is not known (0: lost when it was read) gets no pinned-memory limit, as NVIDIA
    skips zero-memory devices: "0=0M" would leave the container no device memory at all.
    """
    memory_mib = pinned_memory_limit_mib(memory_bytes, replicas) * max(shares, 1)
    envs = {
        "CUDA_MPS_PIPE_DIRECTORY": container_pipe_dir(resource_name),
        "CUDA_MPS_LOG_DIRECTORY": container_log_dir(resource_name),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory_mib}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(active_thread_percentage(replicas, shares)),
    }
    if memory_mib <= 0:
        del envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]
    return envs


def single_gpu_preference(
    plan: ResourcePlan, available: Sequence[str], must_include: Sequence[str], size: int
) -> list[str] | None:
    """`size` available replicas of one GPU (the one with the fewest free that still fits), or None.

    With `must_include`, only its GPU qualifies (None when it names replicas of several GPUs).
    """
    included = set(must_include)
    offered = set(available) | included
    free: dict[str, list[str]] = {}
    required: set[str] = set()
    for dev in plan.devices:
        if dev.replica is not None and dev.id in offered:
            free.setdefault(dev.physical_uuid, []).append(dev.id)
        if dev.id in included:
            required.add(dev.physical_uuid)
    if len(required) > 1:
        return None
    fitting = [(len(ids), uuid) for uuid, ids in free.items() if len(ids) >= size and required <= {uuid}]
    if not fitting:
        return None
    _, uuid = min(fitting)
    chosen = [i for i in must_include if i in free[uuid]]
    chosen += [i for i in free[uuid] if i not in chosen][: size - len(chosen)]
    return chosen


def client_mounts(resource_name: str, gpu_uuid: str, mps_root: str) -> list[api_pb2.Mount]:
    """Mounts for a container holding an MPS replica of `gpu_uuid`: its daemon's pipe and log, and shm."""
    return [
        api_pb2.Mount(
            container_path=container_pipe_dir(resource_name),
            host_path=host_pipe_dir(mps_root, resource_name, gpu_uuid),
        ),
        api_pb2.Mount(
            container_path=container_log_dir(resource_name),
            host_path=host_log_dir(mps_root, resource_name, gpu_uuid),
            read_only=True,
        ),
        api_pb2.Mount(container_path=CONTAINER_SHM_DIR, host_path=host_shm_dir(mps_root)),
    ]

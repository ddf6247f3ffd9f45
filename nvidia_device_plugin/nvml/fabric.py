"""A GPU's place on a multi-node NVLink fabric, from nvmlDeviceGetGpuFabricInfo, judged as NVIDIA does.

GFD labels `nvidia.com/gpu.clique` from it (and NVIDIA's DRA ComputeDomains select nodes on that label).
go-nvlib's IsFabricAttached decides whether a GPU is attached; the same rules here:

- NOT_SUPPORTED (pre-Hopper GPUs, GPUs on no fabric) and a driver without the call: not attached, quietly;
- registration not COMPLETED (not started, in progress), a failed `status`, or an all-zero cluster UUID (a
  GPU whose fabric manager runs but that belongs to no multi-node fabric): not attached;
- any other error: not attached, with a DiscoveryProblem saying the clique label is left out (GFD fails its
  whole labelling pass there, publishing nothing).

The cluster UUID is written as the UUID's usual text and the clique ID in decimal, as NVIDIA's tools write
them.
"""

from __future__ import annotations

import ctypes

import pynvml

from nvidia_device_plugin.base.uuids import uuid_text
from nvidia_device_plugin.devices import GpuFabric
from nvidia_device_plugin.nvml.api import DeviceHandle, GpuFabricInfo
from nvidia_device_plugin.nvml.errors import NvmlErrorKind
from nvidia_device_plugin.nvml.reader import Reader

_QUIET = frozenset({NvmlErrorKind.NOT_SUPPORTED, NvmlErrorKind.CALL_MISSING})
_NO_CLUSTER = bytes(pynvml.NVML_GPU_FABRIC_UUID_LEN)


def read_fabric(reader: Reader, handle: DeviceHandle, index: int) -> GpuFabric | None:
    """The GPU's cluster UUID and clique ID when it is attached to an NVLink fabric, else None."""
    nv = reader.nv

    def nvmlDeviceGetGpuFabricInfo(device: DeviceHandle) -> GpuFabricInfo | None:  # named as the call
        info: GpuFabricInfo = pynvml.c_nvmlGpuFabricInfo_t()
        nv.nvmlDeviceGetGpuFabricInfo(device, ctypes.byref(info))  # type: ignore[arg-type]
        return info

    info = reader.call(
        nvmlDeviceGetGpuFabricInfo,
        handle,
        gpu=index,
        what=f"reading the NVLink fabric of GPU {index}",
        fallback=None,
        consequence="its nvidia.com/gpu.clique label is left out",
        quiet=_QUIET,
    )
    return None if info is None else fabric_of(info)


def fabric_of(info: GpuFabricInfo) -> GpuFabric | None:
    """go-nvlib's IsFabricAttached and GetFabricIDs over one filled c_nvmlGpuFabricInfo_t."""
    cluster = bytes(info.clusterUuid)
    if info.state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED or info.status != pynvml.NVML_SUCCESS:
        return None
    if cluster == _NO_CLUSTER:
        return None
    return GpuFabric(cluster_uuid=uuid_text(cluster), clique_id=int(info.cliqueId))

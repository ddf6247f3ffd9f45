"""Discovery: read the node's GPUs, MIG devices, NUMA nodes and interconnect through pynvml's API.

`nv` is the pynvml module on a real node and a SimulatedNvml in simulation (both an NvmlApi); this
code cannot tell.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pynvml

from nvidia_device_plugin.devices import Gpu, GpuLink, Inventory, MigDevice, PcieLevel
from nvidia_device_plugin.nvml.api import DeviceHandle, NvmlApi
from nvidia_device_plugin.nvml.errors import nvml_call, nvml_error


def discover(nv: NvmlApi, sysfs_root: Path = Path("/sys")) -> Inventory:
    """Inventory of the node. NVML must be initialised; failures raise NvmlError naming the call."""
    count = nvml_call(nv.nvmlDeviceGetCount, what="counting GPUs")
    handles = [nvml_call(nv.nvmlDeviceGetHandleByIndex, i, what=f"opening GPU {i}") for i in range(count)]
    gpus = tuple(_gpu(nv, i, h, sysfs_root) for i, h in enumerate(handles))
    return Inventory(
        gpus=gpus,
        links=_links(nv, handles, gpus),
        driver_version=nvml_call(nv.nvmlSystemGetDriverVersion, what="reading the driver version"),
        cuda_driver_version=nvml_call(nv.nvmlSystemGetCudaDriverVersion, what="reading the CUDA version"),
    )


def _gpu(nv: NvmlApi, index: int, handle: DeviceHandle, sysfs_root: Path) -> Gpu:
    what = f"reading GPU {index}"
    uuid = nvml_call(nv.nvmlDeviceGetUUID, handle, what=what)
    memory = nvml_call(nv.nvmlDeviceGetMemoryInfo, handle, what=what).total
    bus_id = _decode(nvml_call(nv.nvmlDeviceGetPciInfo, handle, what=what).busId)
    mig_enabled = _mig_enabled(nv, handle, index)
    return Gpu(
        index=index,
        uuid=uuid,
        name=nvml_call(nv.nvmlDeviceGetName, handle, what=what),
        memory_bytes=memory,
        pci_bus_id=bus_id,
        minor=nvml_call(nv.nvmlDeviceGetMinorNumber, handle, what=what),
        numa_node=read_numa_node(bus_id, sysfs_root),
        mig_enabled=mig_enabled,
        mig_devices=_mig_devices(nv, handle, index, uuid, memory) if mig_enabled else (),
    )


def _mig_enabled(nv: NvmlApi, handle: DeviceHandle, index: int) -> bool:
    try:
        current, _pending = nv.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError as exc:
        if exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED:  # pre-Ampere GPUs have no MIG
            return False
        raise nvml_error(exc, f"reading MIG mode of GPU {index}") from exc
    return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)


def _mig_devices(
    nv: NvmlApi, handle: DeviceHandle, index: int, parent_uuid: str, parent_memory: int
) -> tuple[MigDevice, ...]:
    what = f"reading MIG devices of GPU {index}"
    devices = []
    for j in range(nvml_call(nv.nvmlDeviceGetMaxMigDeviceCount, handle, what=what)):
        try:
            mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_NOT_FOUND:  # unused slot
                continue
            raise nvml_error(exc, what) from exc
        attrs = nvml_call(nv.nvmlDeviceGetAttributes, mig, what=what)
        devices.append(
            MigDevice(
                uuid=nvml_call(nv.nvmlDeviceGetUUID, mig, what=what),
                index=j,
                parent_uuid=parent_uuid,
                parent_index=index,
                profile=mig_profile_name(
                    attrs.gpuInstanceSliceCount,
                    attrs.computeInstanceSliceCount,
                    attrs.memorySizeMB,
                    parent_memory,
                ),
                memory_bytes=nvml_call(nv.nvmlDeviceGetMemoryInfo, mig, what=what).total,
                gpu_instance_id=nvml_call(nv.nvmlDeviceGetGpuInstanceId, mig, what=what),
                compute_instance_id=nvml_call(nv.nvmlDeviceGetComputeInstanceId, mig, what=what),
            )
        )
    return tuple(devices)


def mig_profile_name(gpu_slices: int, compute_slices: int, memory_mb: int, gpu_memory_bytes: int) -> str:
    """NVIDIA's MIG profile name ("1g.10gb", "1c.2g.20gb") from a MIG device's attributes.

    The memory figure is the slice's share of the GPU rounded up to eighths, times the GPU's memory
    in whole GB, which is how NVIDIA's tools turn 9856 MB on an 80 GB A100 into "10gb".
    """
    fraction = math.ceil(memory_mb * 1024 * 1024 / gpu_memory_bytes * 8) / 8
    total_gb = -(-gpu_memory_bytes // (1024**3))
    gb = round(fraction * total_gb)
    if compute_slices == gpu_slices:
        return f"{gpu_slices}g.{gb}gb"
    return f"{compute_slices}c.{gpu_slices}g.{gb}gb"


def read_numa_node(pci_bus_id: str, sysfs_root: Path) -> int | None:
    """NUMA node of a PCI device from sysfs; None when the kernel does not know (-1) or the file is absent."""
    domain, rest = pci_bus_id.lower().split(":", 1)
    path = sysfs_root / "bus" / "pci" / "devices" / f"{domain[-4:]}:{rest}" / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _links(nv: NvmlApi, handles: list[DeviceHandle], gpus: tuple[Gpu, ...]) -> tuple[GpuLink, ...]:
    by_bus = {g.pci_bus_id.lower(): g.index for g in gpus}
    direct: list[Counter[int]] = []
    to_switch: list[int] = []
    for handle in handles:
        peers, switch = _nvlinks(nv, handle, by_bus)
        direct.append(peers)
        to_switch.append(switch)
    links = []
    for a in gpus:
        for b in gpus[a.index + 1 :]:
            lanes = direct[a.index][b.index]
            if to_switch[a.index] and to_switch[b.index]:
                lanes += min(to_switch[a.index], to_switch[b.index])
            level = nvml_call(
                nv.nvmlDeviceGetTopologyCommonAncestor,
                handles[a.index],
                handles[b.index],
                what=f"reading PCIe topology of GPUs {a.index} and {b.index}",
            )
            links.append(GpuLink(a=a.index, b=b.index, nvlinks=lanes, pcie=_pcie_level(level)))
    return tuple(links)


def _nvlinks(nv: NvmlApi, handle: DeviceHandle, by_bus: dict[str, int]) -> tuple[Counter[int], int]:
    """NVLink lanes from one GPU: per peer GPU index, and the number going to NVSwitches."""
    peers: Counter[int] = Counter()
    switch = 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nv.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
            remote_bus = _decode(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).lower()
            remote_type = _remote_type(nv, handle, link, remote_bus, by_bus)
        except pynvml.NVMLError as exc:
            if exc.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                break  # no NVLink on this GPU, or past its last link
            raise nvml_error(exc, f"reading NVLink {link}") from exc
        if remote_type == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            switch += 1
        elif remote_bus in by_bus:
            peers[by_bus[remote_bus]] += 1
    return peers, switch


def _remote_type(
    nv: NvmlApi, handle: DeviceHandle, link: int, remote_bus: str, by_bus: dict[str, int]
) -> int:
    try:
        return int(nv.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
    except pynvml.NVMLError as exc:
        # Older drivers lack the call: a remote that is one of our GPUs is a GPU, anything else a switch.
        if exc.value != pynvml.NVML_ERROR_NOT_SUPPORTED and not isinstance(
            exc, pynvml.NVMLError_FunctionNotFound
        ):
            raise
        return int(
            pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
            if remote_bus in by_bus
            else pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        )


def _pcie_level(level: int) -> PcieLevel:
    for candidate in sorted(PcieLevel, reverse=True):
        if level >= candidate:
            return candidate
    return PcieLevel.INTERNAL


def _decode(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

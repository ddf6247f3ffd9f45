"""Discovery: read the node's GPUs, MIG devices, NUMA nodes and interconnect through pynvml's API.

`nv` is the pynvml module on a real node and a SimulatedNvml in simulation (both an NvmlApi); this
code cannot tell. One GPU is read in steps (`_gpu`); MIG devices (mig_discovery.py), the links between
GPUs (topology.py) and sysfs (pci.py) have modules of their own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pynvml

from nvidia_device_plugin.devices import Gpu, Inventory
from nvidia_device_plugin.nvml.api import DeviceHandle, NvmlApi
from nvidia_device_plugin.nvml.errors import (
    ABSENT,
    NVML_CALL_STUCK,
    NvmlErrorKind,
    classify,
    error_code,
    nvml_call,
    nvml_error,
)
from nvidia_device_plugin.nvml.fabric import read_fabric
from nvidia_device_plugin.nvml.mig_discovery import read_mig_devices
from nvidia_device_plugin.nvml.mig_placements import read_mig_placements
from nvidia_device_plugin.nvml.mig_profiles import CapsMinors, read_mig_minors
from nvidia_device_plugin.nvml.pci import (
    bus_id_text,
    read_numa_node,
    read_pci_class,
    read_pcie_root,
    sysfs_pci_dir,
)
from nvidia_device_plugin.nvml.product import read_brand_and_architecture
from nvidia_device_plugin.nvml.reader import GpuLost, Reader, raise_if_lost
from nvidia_device_plugin.nvml.topology import read_links
from nvidia_device_plugin.nvml.vgpu import read_vgpu

_NOT_SUPPORTED = frozenset({NvmlErrorKind.NOT_SUPPORTED})
# Display adapters of DGX Stations: NVML lists them, they run no CUDA work (NVIDIA's plugin skips them).
DISPLAY_GPU_NAMES = frozenset({"DGX Display", "NVIDIA DGX Display"})
_NOT_ADVERTISED = "not advertised"


@dataclass(frozen=True)
class _Host:
    """Where discovery reads the host beside NVML: sysfs (NUMA, PCI class), procfs (MIG capabilities)."""

    sysfs_root: Path
    proc_root: Path | None  # None: MIG capability minors are not resolved

    @functools.cached_property
    def caps(self) -> CapsMinors:
        """The MIG capability minors, read when a MIG device first needs them: a node with no GPU in MIG
        mode never parses the file (a line per possible GPU and compute instance, about 100 KiB)."""
        return read_mig_minors(self.proc_root) if self.proc_root is not None else {}


def discover(nv: NvmlApi, sysfs_root: Path = Path("/sys"), proc_root: Path | None = None) -> Inventory:
    """Inventory of the node. NVML must be initialised.

    Degrades per GPU and per call: what could not be read is listed in `Inventory.problems`, a GPU that
    answers GPU_IS_LOST is kept with `lost=True`. Raises NvmlError only when the GPUs cannot be counted.
    `proc_root` is where the MIG capability minors are read (none are resolved when it is None).
    """
    count = nvml_call(nv.nvmlDeviceGetCount, what="counting GPUs")
    reader = Reader(nv)
    host = _Host(sysfs_root, proc_root)
    found = [read for i in range(count) if (read := _read_gpu(reader, i, host)) is not None]
    gpus, links = read_links(reader, found)
    driver = reader.call(
        nv.nvmlSystemGetDriverVersion,
        gpu=None,
        what="reading the driver version",
        fallback="",
        consequence="reported as unknown",
    )
    cuda = reader.call(
        nv.nvmlSystemGetCudaDriverVersion,
        gpu=None,
        what="reading the CUDA version",
        fallback=0,
        consequence="reported as unknown",
    )
    return Inventory(
        gpus=gpus,
        links=links,
        driver_version=driver,
        cuda_driver_version=cuda,
        problems=tuple(reader.problems),
    )


def rediscover_gpu(
    nv: NvmlApi, index: int, sysfs_root: Path = Path("/sys"), proc_root: Path | None = None
) -> Gpu | None:
    """GPU `index` read again on its own, as `discover` reads each GPU (its links to other GPUs are not
    read): what a MIG change on it needs seen, without reading every GPU. None when it cannot be read."""
    reader = Reader(nv)
    host = _Host(sysfs_root, proc_root)
    read = _read_gpu(reader, index, host)
    return None if read is None else read[0]


@dataclass
class _Progress:
    """What a GPU's reading had got to: what is served of it when a call on it gets stuck."""

    handle: DeviceHandle | None = None
    gpu: Gpu | None = None


def _read_gpu(reader: Reader, index: int, host: _Host) -> tuple[Gpu, DeviceHandle] | None:
    """GPU `index` and its handle, read on its lane in one job; None when it cannot be advertised.

    A call on it that gets stuck (nvml/bounded.py) leaves it served as lost with what was read before,
    as GPU_IS_LOST does; stuck before its UUID was read, it is not advertised (a reload carries it over
    from the inventory before, snapshot.carry_over_lost).
    """
    progress = _Progress()

    def job() -> tuple[Gpu, DeviceHandle] | None:
        progress.handle = _open_gpu(reader, index)
        if progress.handle is None:
            return None
        gpu = _gpu(reader, index, progress.handle, host, progress)
        return None if gpu is None else (gpu, progress.handle)

    try:
        return reader.on_gpu(index, f"reading GPU {index}", job)
    except GpuLost as lost:
        if progress.gpu is None or progress.handle is None:
            message = f"GPU {index}: {lost.call} is stuck in the NVIDIA driver; {_NOT_ADVERTISED}"
            reader.note(index, lost.call, NVML_CALL_STUCK, message)
            return None
        reader.note_lost(index, progress.gpu.uuid, lost.call, stuck=True)
        return replace(progress.gpu, lost=True), progress.handle


def _open_gpu(reader: Reader, index: int) -> DeviceHandle | None:
    try:
        return reader.nv.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError as exc:
        reader.note(
            index,
            "nvmlDeviceGetHandleByIndex",
            error_code(exc),
            f"{nvml_error(exc, f'opening GPU {index}')}; {_NOT_ADVERTISED}",
        )
        return None


def _gpu(reader: Reader, index: int, handle: DeviceHandle, host: _Host, progress: _Progress) -> Gpu | None:
    """One GPU, or None when it cannot be advertised (its UUID or minor unreadable, a display adapter).

    Each step adds what it read to `gpu`, which stays `lost` until the last one: a GPU that answers
    GPU_IS_LOST midway is served, as lost, with what was read before.
    """
    uuid = _read_uuid(reader, index, handle)
    if uuid is None:
        return None
    gpu = progress.gpu = _unread_gpu(index, uuid)
    try:
        gpu = progress.gpu = replace(gpu, name=_read_name(reader, index, handle))
        if gpu.name in DISPLAY_GPU_NAMES:
            return None
        minor = _read_minor(reader, index, handle)
        if minor is None:
            return None
        gpu = progress.gpu = replace(gpu, minor=minor)
        gpu = progress.gpu = replace(gpu, memory_bytes=_read_memory(reader, index, handle))
        gpu = progress.gpu = _with_pci(reader, index, handle, gpu, host.sysfs_root)
        mig_mode = _mig_enabled(reader, handle, index)
        if mig_mode is None:
            return None
        mig_enabled, mig_capable = mig_mode
        gpu = progress.gpu = _with_platform_facts(
            reader, index, handle, host, replace(gpu, mig_capable=mig_capable)
        )
        migs = read_mig_devices(reader, handle, gpu, host.proc_root, host.caps) if mig_enabled else ()
        placements, memory_slices = read_mig_placements(reader, handle, gpu) if mig_enabled else ((), 0)
    except GpuLost as lost:
        if lost.stuck:
            raise  # stuck: _read_gpu serves what `progress` holds
        reader.note_lost(index, uuid, lost.call)
        return gpu
    return replace(
        gpu,
        mig_enabled=mig_enabled,
        mig_devices=migs,
        mig_placements=placements,
        mig_memory_slices=memory_slices,
        lost=False,
    )


def _with_platform_facts(reader: Reader, index: int, handle: DeviceHandle, host: _Host, gpu: Gpu) -> Gpu:
    """`gpu` with what labels and DRA read beside the allocation facts: compute capability, PCI class
    and root, NVLink fabric, the vGPU capability, brand and architecture."""
    vgpu_checked, vgpu = read_vgpu(gpu.pci_bus_id, host.sysfs_root)
    brand, architecture = read_brand_and_architecture(reader, handle, index)
    return replace(
        gpu,
        compute_capability=_compute_capability(reader, handle, index),
        pci_class=read_pci_class(gpu.pci_bus_id, host.sysfs_root),
        fabric=read_fabric(reader, handle, index),
        vgpu=vgpu,
        vgpu_checked=vgpu_checked,
        pcie_root=read_pcie_root(gpu.pci_bus_id, host.sysfs_root),
        brand=brand,
        architecture=architecture,
    )


def _unread_gpu(index: int, uuid: str) -> Gpu:
    """What is known of a GPU before any step: its index and UUID; lost until every step has read."""
    return Gpu(
        index=index,
        uuid=uuid,
        name="",
        memory_bytes=0,
        pci_bus_id="",
        minor=-1,
        numa_node=None,
        mig_enabled=False,
        lost=True,
    )


def _read_uuid(reader: Reader, index: int, handle: DeviceHandle) -> str | None:
    try:
        return reader.nv.nvmlDeviceGetUUID(handle)
    except pynvml.NVMLError as exc:
        message = f"{nvml_error(exc, f'reading GPU {index}')}; {_NOT_ADVERTISED}"
        reader.note(index, "nvmlDeviceGetUUID", error_code(exc), message)
        return None


def _read_name(reader: Reader, index: int, handle: DeviceHandle) -> str:
    return reader.call(
        reader.nv.nvmlDeviceGetName,
        handle,
        gpu=index,
        what=f"reading GPU {index}",
        fallback="unknown GPU",
        consequence="named 'unknown GPU'",
    )


def _read_minor(reader: Reader, index: int, handle: DeviceHandle) -> int | None:
    """The N of /dev/nvidia<N>; None (with a problem) when unreadable: the GPU cannot be handed out."""
    try:
        return reader.nv.nvmlDeviceGetMinorNumber(handle)
    except pynvml.NVMLError as exc:
        raise_if_lost(exc, "nvmlDeviceGetMinorNumber")
        reader.note(
            index,
            "nvmlDeviceGetMinorNumber",
            error_code(exc),
            f"{nvml_error(exc, f'reading GPU {index}')}; {_NOT_ADVERTISED} (its /dev/nvidia<N> is unknown)",
        )
        return None


def _read_memory(reader: Reader, index: int, handle: DeviceHandle) -> int:
    nv = reader.nv

    def nvmlDeviceGetMemoryInfo(device: DeviceHandle) -> int:  # named as the call, for problems
        return nv.nvmlDeviceGetMemoryInfo(device).total

    return reader.call(
        nvmlDeviceGetMemoryInfo,
        handle,
        gpu=index,
        what=f"reading the memory of GPU {index}",
        fallback=0,
        consequence="memory reported as 0 (MPS memory limits and MIG names need it)",
    )


def _with_pci(reader: Reader, index: int, handle: DeviceHandle, gpu: Gpu, sysfs_root: Path) -> Gpu:
    """`gpu` with its PCI bus ID and NUMA node."""
    bus_id = reader.call(
        _bus_id(reader.nv),
        handle,
        gpu=index,
        what=f"reading the PCI bus ID of GPU {index}",
        fallback="",
        consequence="its NUMA node and topology are unknown",
    )
    return replace(gpu, pci_bus_id=bus_id, numa_node=_numa_node(reader.nv, handle, bus_id, sysfs_root))


def _bus_id(nv: NvmlApi) -> Callable[[DeviceHandle], str]:
    def nvmlDeviceGetPciInfo(handle: DeviceHandle) -> str:
        return bus_id_text(nv.nvmlDeviceGetPciInfo(handle))

    return nvmlDeviceGetPciInfo


def _numa_node(nv: NvmlApi, handle: DeviceHandle, bus_id: str, sysfs_root: Path) -> int | None:
    directory = sysfs_pci_dir(bus_id, sysfs_root)
    if directory is not None and (directory / "numa_node").exists():
        return read_numa_node(bus_id, sysfs_root)
    try:  # no sysfs entry (a container without /sys/bus/pci): ask the driver, where it can say
        node = int(nv.nvmlDeviceGetNumaNodeId(handle))
    except pynvml.NVMLError as exc:
        raise_if_lost(exc, "nvmlDeviceGetNumaNodeId")
        return None
    return node if node >= 0 else None


def _mig_enabled(reader: Reader, handle: DeviceHandle, index: int) -> tuple[bool, bool] | None:
    """(MIG enabled, MIG capable); None (with a problem) when MIG mode cannot be read: advertising it
    either way could be wrong."""
    try:
        current, _pending = reader.nv.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError as exc:
        if classify(exc) in ABSENT:
            return False, False  # pre-Ampere GPUs have no MIG
        raise_if_lost(exc, "nvmlDeviceGetMigMode")
        reader.note(
            index,
            "nvmlDeviceGetMigMode",
            error_code(exc),
            f"{nvml_error(exc, f'reading MIG mode of GPU {index}')}; {_NOT_ADVERTISED}",
        )
        return None
    return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE), True


def _compute_capability(reader: Reader, handle: DeviceHandle, index: int) -> tuple[int, int] | None:
    """CUDA compute capability, for node labels only: a failure leaves those labels out."""
    nv = reader.nv

    def nvmlDeviceGetCudaComputeCapability(device: DeviceHandle) -> tuple[int, int] | None:
        major, minor = nv.nvmlDeviceGetCudaComputeCapability(device)
        return int(major), int(minor)

    return reader.call(
        nvmlDeviceGetCudaComputeCapability,
        handle,
        gpu=index,
        what=f"reading the compute capability of GPU {index}",
        fallback=None,
        consequence="its architecture labels are left out",
        quiet=_NOT_SUPPORTED,
    )

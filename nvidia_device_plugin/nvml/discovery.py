"""Discovery: read the node's GPUs, MIG devices, NUMA nodes and interconnect through pynvml's API.

`nv` is the pynvml module on a real node and a SimulatedNvml in simulation (both an NvmlApi); this
code cannot tell.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pynvml

from nvidia_device_plugin.devices import Gpu, GpuLink, Inventory, PcieLevel
from nvidia_device_plugin.nvml.api import DeviceHandle, NvmlApi
from nvidia_device_plugin.nvml.errors import NvmlErrorKind, classify, error_code, nvml_call, nvml_error
from nvidia_device_plugin.nvml.mig_discovery import read_mig_devices
from nvidia_device_plugin.nvml.mig_profiles import CapsMinors, mig_profile_name, read_mig_minors
from nvidia_device_plugin.nvml.reader import GpuLost, Reader, raise_if_lost

__all__ = ["discover", "mig_profile_name", "read_numa_node"]


_NOT_SUPPORTED = frozenset({NvmlErrorKind.NOT_SUPPORTED})
# What a GPU without the feature (MIG mode before Ampere) or the link (an NVLink it lacks) answers.
_ABSENT = frozenset({NvmlErrorKind.NOT_SUPPORTED, NvmlErrorKind.INVALID_ARGUMENT})
# Display adapters of DGX Stations: NVML lists them, they run no CUDA work (NVIDIA's plugin skips them).
DISPLAY_GPU_NAMES = frozenset({"DGX Display", "NVIDIA DGX Display"})


def discover(nv: NvmlApi, sysfs_root: Path = Path("/sys"), proc_root: Path | None = None) -> Inventory:
    """Inventory of the node. NVML must be initialised.

    Degrades per GPU and per call: what could not be read is listed in `Inventory.problems`, a GPU that
    answers GPU_IS_LOST is kept with `lost=True`. Raises NvmlError only when the GPUs cannot be counted.
    `proc_root` is where the MIG capability minors are read (none are resolved when it is None).
    """
    count = nvml_call(nv.nvmlDeviceGetCount, what="counting GPUs")
    reader = Reader(nv)
    caps = read_mig_minors(proc_root) if proc_root is not None else {}
    found: list[tuple[Gpu, DeviceHandle]] = []
    for i in range(count):
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(i)
        except pynvml.NVMLError as exc:
            reader.note(
                i,
                "nvmlDeviceGetHandleByIndex",
                error_code(exc),
                f"{nvml_error(exc, f'opening GPU {i}')}; not advertised",
            )
            continue
        gpu = _gpu(reader, i, handle, sysfs_root, proc_root, caps)
        if gpu is not None:
            found.append((gpu, handle))
    gpus, links = _links(reader, found)
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


def _gpu(
    reader: Reader,
    index: int,
    handle: DeviceHandle,
    sysfs_root: Path,
    proc_root: Path | None,
    caps: CapsMinors,
) -> Gpu | None:
    """One GPU, or None when it cannot be advertised (its UUID or minor unreadable, a display adapter)."""
    nv = reader.nv
    what = f"reading GPU {index}"
    skip = "not advertised"
    try:
        uuid = nv.nvmlDeviceGetUUID(handle)
    except pynvml.NVMLError as exc:
        reader.note(index, "nvmlDeviceGetUUID", error_code(exc), f"{nvml_error(exc, what)}; {skip}")
        return None
    partial = Gpu(
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
    try:
        name = reader.call(
            nv.nvmlDeviceGetName,
            handle,
            gpu=index,
            what=what,
            fallback="unknown GPU",
            consequence="named 'unknown GPU'",
        )
        partial = replace(partial, name=name)
        if name in DISPLAY_GPU_NAMES:
            return None
        try:
            minor = nv.nvmlDeviceGetMinorNumber(handle)
        except pynvml.NVMLError as exc:
            raise_if_lost(exc, "nvmlDeviceGetMinorNumber")
            reader.note(
                index,
                "nvmlDeviceGetMinorNumber",
                error_code(exc),
                f"{nvml_error(exc, what)}; {skip} (its /dev/nvidia<N> is unknown)",
            )
            return None
        partial = replace(partial, minor=minor)
        memory = reader.call(
            _total_memory(nv),
            handle,
            gpu=index,
            what=f"reading the memory of GPU {index}",
            fallback=0,
            consequence="memory reported as 0 (MPS memory limits and MIG names need it)",
        )
        partial = replace(partial, memory_bytes=memory)
        bus_id = reader.call(
            _bus_id(nv),
            handle,
            gpu=index,
            what=f"reading the PCI bus ID of GPU {index}",
            fallback="",
            consequence="its NUMA node and topology are unknown",
        )
        partial = replace(partial, pci_bus_id=bus_id, numa_node=_numa_node(nv, handle, bus_id, sysfs_root))
        mig_mode = _mig_enabled(reader, handle, index)
        if mig_mode is None:
            return None
        mig_enabled, mig_capable = mig_mode
        partial = replace(
            partial,
            mig_capable=mig_capable,
            compute_capability=_compute_capability(reader, handle, index),
            pci_class=read_pci_class(bus_id, sysfs_root),
        )
        migs = read_mig_devices(reader, handle, partial, proc_root, caps) if mig_enabled else ()
    except GpuLost as lost:
        reader.note(
            index,
            lost.call,
            pynvml.NVML_ERROR_GPU_IS_LOST,
            lost_message(index, uuid, lost.call),
        )
        return partial
    return replace(partial, mig_enabled=mig_enabled, mig_devices=migs, lost=False)


def _total_memory(nv: NvmlApi) -> Callable[[DeviceHandle], int]:
    def nvmlDeviceGetMemoryInfo(handle: DeviceHandle) -> int:  # named as the call, for problems
        return nv.nvmlDeviceGetMemoryInfo(handle).total

    return nvmlDeviceGetMemoryInfo


def _bus_id(nv: NvmlApi) -> Callable[[DeviceHandle], str]:
    def nvmlDeviceGetPciInfo(handle: DeviceHandle) -> str:
        return _decode(nv.nvmlDeviceGetPciInfo(handle).busId)

    return nvmlDeviceGetPciInfo


def _mig_enabled(reader: Reader, handle: DeviceHandle, index: int) -> tuple[bool, bool] | None:
    """(MIG enabled, MIG capable); None (with a problem) when MIG mode cannot be read: advertising it
    either way could be wrong."""
    try:
        current, _pending = reader.nv.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError as exc:
        if classify(exc) in _ABSENT:
            return False, False  # pre-Ampere GPUs have no MIG
        raise_if_lost(exc, "nvmlDeviceGetMigMode")
        reader.note(
            index,
            "nvmlDeviceGetMigMode",
            error_code(exc),
            f"{nvml_error(exc, f'reading MIG mode of GPU {index}')}; not advertised",
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


def read_pci_class(pci_bus_id: str, sysfs_root: Path) -> str | None:
    """The PCI class of a GPU from sysfs ("0x030200": 3D controller), as GFD reads it; None when absent."""
    path = _sysfs_pci_dir(pci_bus_id, sysfs_root)
    if path is None:
        return None
    try:
        text = (path / "class").read_text().strip().lower()
    except OSError:
        return None
    return text if text.startswith("0x") else None


def read_numa_node(pci_bus_id: str, sysfs_root: Path) -> int | None:
    """NUMA node of a PCI device from sysfs; None when the kernel does not know (-1) or the file is absent.

    NVML writes the domain as 8 hex digits, the kernel as at least 4 ("0000:07:00.0", and "10000:01:00.0"
    for a VMD domain above 0xFFFF): the path is built the kernel's way.
    """
    path = _sysfs_pci_dir(pci_bus_id, sysfs_root)
    if path is None:
        return None
    try:
        node = int((path / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def sysfs_pci_name(pci_bus_id: str) -> str | None:
    """The kernel's name of a PCI device ("0000:07:00.0") from NVML's bus ID, or None when malformed."""
    domain, sep, rest = pci_bus_id.lower().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}" if sep and rest else None
    except ValueError:
        return None


def _sysfs_pci_dir(pci_bus_id: str, sysfs_root: Path) -> Path | None:
    name = sysfs_pci_name(pci_bus_id)
    return None if name is None else sysfs_root / "bus" / "pci" / "devices" / name


def _numa_node(nv: NvmlApi, handle: DeviceHandle, bus_id: str, sysfs_root: Path) -> int | None:
    directory = _sysfs_pci_dir(bus_id, sysfs_root)
    if directory is not None and (directory / "numa_node").exists():
        return read_numa_node(bus_id, sysfs_root)
    try:  # no sysfs entry (a container without /sys/bus/pci): ask the driver, where it can say
        node = int(nv.nvmlDeviceGetNumaNodeId(handle))
    except pynvml.NVMLError as exc:
        raise_if_lost(exc, "nvmlDeviceGetNumaNodeId")
        return None
    return node if node >= 0 else None


def _links(
    reader: Reader, found: list[tuple[Gpu, DeviceHandle]]
) -> tuple[tuple[Gpu, ...], tuple[GpuLink, ...]]:
    """The GPUs (some perhaps newly found lost) and how each pair is connected."""
    lost: set[int] = {gpu.index for gpu, _ in found if gpu.lost}
    by_bus = {g.pci_bus_id.lower(): g.index for g, _ in found if g.pci_bus_id}
    direct: dict[int, Counter[int]] = {}
    to_switch: dict[int, int] = {}
    for gpu, handle in found:
        if gpu.index in lost:
            direct[gpu.index], to_switch[gpu.index] = Counter(), 0
            continue
        try:
            direct[gpu.index], to_switch[gpu.index] = _nvlinks(reader, gpu.index, handle, by_bus)
        except GpuLost as exc:
            _note_lost(reader, gpu, exc.call)
            lost.add(gpu.index)
            direct[gpu.index], to_switch[gpu.index] = Counter(), 0
    links = []
    for k, (a, ha) in enumerate(found):
        for b, hb in found[k + 1 :]:
            lanes = max(direct[a.index][b.index], direct[b.index][a.index])
            if to_switch[a.index] and to_switch[b.index]:
                lanes += min(to_switch[a.index], to_switch[b.index])
            level = PcieLevel.SYSTEM
            if a.index not in lost and b.index not in lost:
                level = _common_ancestor(reader, a, ha, b, hb, lost)
            links.append(GpuLink(a=a.index, b=b.index, nvlinks=lanes, pcie=level))
    gpus = tuple(
        replace(
            gpu,
            lost=gpu.lost or gpu.index in lost,
            nvswitch_links=to_switch[gpu.index],
        )
        for gpu, _ in found
    )
    return gpus, tuple(links)


def _common_ancestor(
    reader: Reader, a: Gpu, ha: DeviceHandle, b: Gpu, hb: DeviceHandle, lost: set[int]
) -> PcieLevel:
    # NOT_SUPPORTED / UNKNOWN are normal on some nodes (NVIDIA queries topology only when it needs it):
    # the pair is taken as the farthest apart, which only makes preferred allocation less picky.
    try:
        return _pcie_level(reader.nv.nvmlDeviceGetTopologyCommonAncestor(ha, hb))
    except pynvml.NVMLError as exc:
        if classify(exc) is NvmlErrorKind.GPU_LOST:
            for gpu, handle in ((a, ha), (b, hb)):  # which of the two is lost: ask each on its own
                try:
                    reader.nv.nvmlDeviceGetTopologyCommonAncestor(handle, handle)
                except pynvml.NVMLError as inner:
                    if classify(inner) is NvmlErrorKind.GPU_LOST and gpu.index not in lost:
                        lost.add(gpu.index)
                        _note_lost(reader, gpu, "nvmlDeviceGetTopologyCommonAncestor")
        else:
            reader.note(
                None,
                "nvmlDeviceGetTopologyCommonAncestor",
                error_code(exc),
                f"{nvml_error(exc, f'reading PCIe topology of GPUs {a.index} and {b.index}')}; "
                "GPUs whose topology is unknown are taken as across NUMA nodes",
            )
        return PcieLevel.SYSTEM


def lost_message(index: int, uuid: str, call: str) -> str:
    return (
        f"GPU {index} ({uuid}) is lost (GPU_IS_LOST from {call}); advertised as Unhealthy and checked "
        "again every poll"
    )


def _note_lost(reader: Reader, gpu: Gpu, call: str) -> None:
    reader.note(
        gpu.index,
        call,
        pynvml.NVML_ERROR_GPU_IS_LOST,
        lost_message(gpu.index, gpu.uuid, call),
    )


def _nvlinks(
    reader: Reader, index: int, handle: DeviceHandle, by_bus: dict[str, int]
) -> tuple[Counter[int], int]:
    """NVLink lanes from one GPU: per peer GPU index, and the number going to NVSwitches.

    A link that fails is skipped and the next one read: NOT_SUPPORTED / INVALID_ARGUMENT are normal for
    links a GPU does not have (an H100 has 18, an A100 12), and one bad link must not hide the others.
    """
    nv = reader.nv
    peers: Counter[int] = Counter()
    switch = 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nv.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
            remote_bus = _decode(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).lower()
            remote_type = _remote_type(nv, handle, link, remote_bus, by_bus)
        except pynvml.NVMLError as exc:
            raise_if_lost(exc, "nvmlDeviceGetNvLinkState")
            if classify(exc) not in _ABSENT:
                reader.note(
                    index,
                    "nvmlDeviceGetNvLinkState",
                    error_code(exc),
                    f"{nvml_error(exc, f'reading NVLink {link} of GPU {index}')}; that link is left out",
                )
            continue
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
        if classify(exc) not in (NvmlErrorKind.NOT_SUPPORTED, NvmlErrorKind.CALL_MISSING):
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

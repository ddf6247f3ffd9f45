"""How the GPUs of a node are connected: NVLink lanes (to each other and to NVSwitches) and PCIe levels.

Read after every GPU (discovery.py): a GPU found lost here is marked lost like one lost while it was read.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pynvml

from nvidia_device_plugin.devices import Gpu, GpuLink, PcieLevel
from nvidia_device_plugin.nvml.api import DeviceHandle, NvmlApi
from nvidia_device_plugin.nvml.errors import ABSENT, LOST, NvmlErrorKind, classify, error_code, nvml_error
from nvidia_device_plugin.nvml.pci import bus_id_text
from nvidia_device_plugin.nvml.reader import GpuLost, Reader, raise_if_lost


def read_links(
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
            direct[gpu.index], to_switch[gpu.index] = reader.on_gpu(
                gpu.index,
                f"reading the NVLinks of GPU {gpu.index}",
                lambda: _nvlinks(reader, gpu.index, handle, by_bus),  # noqa: B023 - called at once
            )
        except GpuLost as exc:
            reader.note_lost(gpu.index, gpu.uuid, exc.call, exc.stuck)
            lost.add(gpu.index)
            direct[gpu.index], to_switch[gpu.index] = Counter(), 0
    links = []
    for k, (a, ha) in enumerate(found):
        levels = _pcie_levels(reader, (a, ha), found[k + 1 :], lost)
        for b, _ in found[k + 1 :]:
            lanes = max(direct[a.index][b.index], direct[b.index][a.index])
            if to_switch[a.index] and to_switch[b.index]:
                lanes += min(to_switch[a.index], to_switch[b.index])
            links.append(GpuLink(a=a.index, b=b.index, nvlinks=lanes, pcie=levels[b.index]))
    gpus = tuple(
        replace(
            gpu,
            lost=gpu.lost or gpu.index in lost,
            nvswitch_links=to_switch[gpu.index],
        )
        for gpu, _ in found
    )
    return gpus, tuple(links)


def _pcie_levels(
    reader: Reader, first: tuple[Gpu, DeviceHandle], others: list[tuple[Gpu, DeviceHandle]], lost: set[int]
) -> dict[int, PcieLevel]:
    """How `first` reaches each of `others` over PCIe (SYSTEM where either is lost), read on the lane of
    `first` in one job; all SYSTEM, and `first` lost, when that job gets stuck."""
    a, ha = first

    def job() -> dict[int, PcieLevel]:
        return {
            b.index: _common_ancestor(reader, a, ha, b, hb, lost)
            if a.index not in lost and b.index not in lost
            else PcieLevel.SYSTEM
            for b, hb in others
        }

    if not others or a.index in lost:
        return dict.fromkeys((b.index for b, _ in others), PcieLevel.SYSTEM)
    try:
        return reader.on_gpu(a.index, f"reading the PCIe topology of GPU {a.index}", job)
    except GpuLost as exc:
        lost.add(a.index)
        reader.note_lost(a.index, a.uuid, exc.call, exc.stuck)
        return dict.fromkeys((b.index for b, _ in others), PcieLevel.SYSTEM)


def _common_ancestor(
    reader: Reader, a: Gpu, ha: DeviceHandle, b: Gpu, hb: DeviceHandle, lost: set[int]
) -> PcieLevel:
    # NOT_SUPPORTED / UNKNOWN are normal on some nodes (NVIDIA queries topology only when it needs it):
    # the pair is taken as the farthest apart, which only makes preferred allocation less picky.
    try:
        return _pcie_level(reader.nv.nvmlDeviceGetTopologyCommonAncestor(ha, hb))
    except pynvml.NVMLError as exc:
        if classify(exc) in LOST:
            for gpu, handle in ((a, ha), (b, hb)):  # which of the two is lost: ask each on its own
                try:
                    reader.nv.nvmlDeviceGetTopologyCommonAncestor(handle, handle)
                except pynvml.NVMLError as inner:
                    if classify(inner) in LOST and gpu.index not in lost:
                        lost.add(gpu.index)
                        stuck = classify(inner) is NvmlErrorKind.STUCK
                        reader.note_lost(gpu.index, gpu.uuid, "nvmlDeviceGetTopologyCommonAncestor", stuck)
        else:
            reader.note(
                None,
                "nvmlDeviceGetTopologyCommonAncestor",
                error_code(exc),
                f"{nvml_error(exc, f'reading PCIe topology of GPUs {a.index} and {b.index}')}; "
                "GPUs whose topology is unknown are taken as across NUMA nodes",
            )
        return PcieLevel.SYSTEM


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
            remote_bus = bus_id_text(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)).lower()
            remote_type = _remote_type(nv, handle, link, remote_bus, by_bus)
        except pynvml.NVMLError as exc:
            raise_if_lost(exc, "nvmlDeviceGetNvLinkState")
            if classify(exc) not in ABSENT:
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

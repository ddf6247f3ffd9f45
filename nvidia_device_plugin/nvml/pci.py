"""A GPU's PCI identity: NVML's bus ID as text, and what the kernel's sysfs says about the device.

NVML writes a bus ID as "00000000:07:00.0" (bytes from ctypes); sysfs names the same device
"0000:07:00.0". Discovery reads the NUMA node and PCI class from there, as GFD does (bounded: boundedio.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from nvidia_device_plugin.base.boundedio import SMALL_FILE_BYTES, read_text
from nvidia_device_plugin.nvml.api import PciInfo

_PCIE_ROOT = re.compile(r"pci[0-9a-f]{4,}:[0-9a-f]{2}")


def bus_id_text(info: PciInfo) -> str:
    """NVML's bus ID of `info` as text (pynvml hands bytes from ctypes; the simulator may hand str)."""
    value = info.busId
    return value.decode() if isinstance(value, bytes) else value


def read_pci_class(pci_bus_id: str, sysfs_root: Path) -> str | None:
    """The PCI class of a GPU from sysfs ("0x030200": 3D controller), as GFD reads it; None when absent."""
    path = sysfs_pci_dir(pci_bus_id, sysfs_root)
    if path is None:
        return None
    try:
        text = read_text(path / "class", SMALL_FILE_BYTES).strip().lower()
    except (OSError, ValueError):
        return None
    return text if text.startswith("0x") else None


def read_numa_node(pci_bus_id: str, sysfs_root: Path) -> int | None:
    """NUMA node of a PCI device from sysfs; None when the kernel does not know (-1) or the file is absent.

    NVML writes the domain as 8 hex digits, the kernel as at least 4 ("0000:07:00.0", and "10000:01:00.0"
    for a VMD domain above 0xFFFF): the path is built the kernel's way.
    """
    path = sysfs_pci_dir(pci_bus_id, sysfs_root)
    if path is None:
        return None
    try:
        node = int(read_text(path / "numa_node", SMALL_FILE_BYTES).strip())
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


def sysfs_pci_dir(pci_bus_id: str, sysfs_root: Path) -> Path | None:
    name = sysfs_pci_name(pci_bus_id)
    return None if name is None else sysfs_root / "bus" / "pci" / "devices" / name


def read_pcie_root(pci_bus_id: str, sysfs_root: Path) -> str | None:
    """The PCIe root complex of a GPU, "pci0000:00", from where sysfs places the device (its
    bus/pci/devices entry links to devices/pci<domain>:<bus>/.../<device>), as Kubernetes' standard
    `resource.kubernetes.io/pcieRoot` device attribute names it; None when sysfs does not say."""
    path = sysfs_pci_dir(pci_bus_id, sysfs_root)
    if path is None:
        return None
    try:
        parts = path.resolve(strict=True).parts
    except (OSError, RuntimeError):  # absent, or a link loop
        return None
    return next((p for p in parts if _PCIE_ROOT.fullmatch(p)), None)

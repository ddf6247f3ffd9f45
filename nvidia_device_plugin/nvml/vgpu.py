"""Is a GPU a vGPU? Its PCI config space in sysfs says, as GFD reads it (internal/vgpu).

A vGPU carries a vendor-specific PCI capability (ID 0x09) whose bytes 3 and 4 are the signature "VF". After
the signature come records (ID, length, data) from byte 5; the record with ID 0 holds the vGPU manager's
host driver version (10 bytes) and branch (10 bytes), NUL-padded. A GPU without that capability is bare
metal or passthrough.

The capability list is reachable only when the config space is read whole (256 bytes): an unprivileged
container reads only the first 64 bytes of `config`, and then nothing can be said (GFD gives up on the
whole node there; here the vGPU labels are left out).
"""

from __future__ import annotations

from pathlib import Path

from nvidia_device_plugin.devices import VgpuInfo
from nvidia_device_plugin.nvml.pci import sysfs_pci_dir

CONFIG_SPACE_BYTES = 256  # the standard header and capabilities (the extended space is not needed)
_MAX_READ = 4096  # the largest config space (PCIe extended): every read is bounded
_STATUS = 0x06
_STATUS_CAPABILITIES = 0x10
_CAPABILITIES_POINTER = 0x34
_VENDOR_SPECIFIC = 0x09
_SIGNATURE = b"VF"
_RECORDS = 5
_FIELD = 10  # bytes of the host driver version, then of the branch


def read_vgpu(pci_bus_id: str, sysfs_root: Path) -> tuple[bool, VgpuInfo | None]:
    """(whether the config space could be read whole, the vGPU it describes or None)."""
    directory = sysfs_pci_dir(pci_bus_id, sysfs_root)
    if directory is None:
        return False, None
    try:
        with (directory / "config").open("rb") as config:
            data = config.read(_MAX_READ)
    except OSError:
        return False, None
    if len(data) < CONFIG_SPACE_BYTES:
        return False, None
    return True, vgpu_of(data)


def vgpu_of(config: bytes) -> VgpuInfo | None:
    """The vGPU a whole config space describes, or None for a GPU that is not one."""
    capability = _vendor_capability(config)
    if capability is None or capability[3:5] != _SIGNATURE:
        return None
    return _host_driver(capability) or VgpuInfo(host_driver_version="", host_driver_branch="")


def _vendor_capability(config: bytes) -> bytes | None:
    """The vendor-specific capability's bytes (its length is its byte 2), walking the capability list."""
    if not config[_STATUS] & _STATUS_CAPABILITIES:
        return None
    seen: set[int] = set()
    position = config[_CAPABILITIES_POINTER]
    while position and position not in seen and position + 2 < len(config):
        seen.add(position)  # a list that loops ends here
        cap_id, following, length = config[position], config[position + 1], config[position + 2]
        if cap_id == 0xFF:
            return None  # a broken list
        if cap_id == _VENDOR_SPECIFIC:
            return config[position : position + length]
        position = following
    return None


def _host_driver(capability: bytes) -> VgpuInfo | None:
    """The record with ID 0 (the host driver's version and branch); None when the records hold none."""
    position = _RECORDS
    while position < len(capability) and capability[position] != 0:
        step = capability[position + 1] if position + 1 < len(capability) else 0
        if step == 0:
            return None  # a record of no length would never end
        position += step
    end = position + 2 + 2 * _FIELD
    if position >= len(capability) or end > len(capability):
        return None
    fields = capability[position + 2 : end]
    return VgpuInfo(
        host_driver_version=_text(fields[:_FIELD]),
        host_driver_branch=_text(fields[_FIELD:]),
    )


def _text(field: bytes) -> str:
    return field.strip(b"\0").decode("ascii", errors="replace")

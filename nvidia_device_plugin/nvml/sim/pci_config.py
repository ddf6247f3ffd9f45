"""The PCI config space of a simulated GPU, as sysfs serves it in `/sys/bus/pci/devices/<bdf>/config`.

256 bytes: NVIDIA's vendor ID, the class, a capability list with a PCI Express capability and, for a vGPU,
the vendor-specific capability a vGPU guest sees ("VF" signature, then the record with the vGPU manager's
host driver version and branch). An unprivileged container reads only the first 64 bytes (the standard
header), as the kernel serves them to a process without CAP_SYS_ADMIN.
"""

from __future__ import annotations

from nvidia_device_plugin.nvml.sim.node import GpuSpec

UNPRIVILEGED_BYTES = 64
_SIZE = 256
_EXPRESS_AT = 0x60
_VENDOR_AT = 0xC8
_FIELD = 10


def pci_config(gpu: GpuSpec, unprivileged: bool = False) -> bytes:
    """`gpu`'s config space (its first 64 bytes when `unprivileged`)."""
    space = bytearray(_SIZE)
    space[0:2] = (0x10DE).to_bytes(2, "little")  # NVIDIA
    space[2:4] = (0x20B0).to_bytes(2, "little")
    space[0x06] = 0x10  # status: a capability list follows
    space[0x09:0x0C] = int(gpu.pci_class, 16).to_bytes(3, "little")
    space[0x34] = _EXPRESS_AT
    space[_EXPRESS_AT : _EXPRESS_AT + 2] = bytes([0x10, _VENDOR_AT if gpu.vgpu is not None else 0])
    if gpu.vgpu is not None:
        version, branch = (_field(text) for text in gpu.vgpu)
        record = bytes([0x00, 2 + 2 * _FIELD]) + version + branch  # ID 0: the host driver
        capability = bytes([0x09, 0x00, 5 + len(record)]) + b"VF" + record
        space[_VENDOR_AT : _VENDOR_AT + len(capability)] = capability
    return bytes(space[:UNPRIVILEGED_BYTES] if unprivileged else space)


def _field(text: str) -> bytes:
    return text.encode("ascii")[:_FIELD].ljust(_FIELD, b"\0")

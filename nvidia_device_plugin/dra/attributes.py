"""One DRA device (resource.k8s.io/v1 `Device`) as this node publishes it: attributes and capacity.

Names and types are NVIDIA's DRA driver's, in its domain (`gpu.nvidia.com/<name>`, written without the
domain): a whole GPU has type=gpu, uuid, productName, brand, architecture, cudaComputeCapability,
driverVersion, cudaDriverVersion (the three as `version` values, so `semver()` selectors work) and a
`memory` capacity; a MIG device type=mig, its uuid, parentUUID, profile, its parent's attributes and the
capacities multiprocessors, copyEngines, decoders, encoders, jpegEngines, ofaEngines, memory. No `index`
(NVIDIA removed it: indices shift when a GPU drops). Kubernetes' standard attributes:
resource.kubernetes.io/pciBusID, pcieRoot and numaNode. Ours: nvlinkDomain and pcieSwitch
(dra/topology.py), resourceName and sharing (dra/sharing.py). An attribute NVML would not give is left
out; a device with list attributes, taints or counters counts against the smaller per-slice limit.

Versions must be strict semver or the API server refuses the slice (and the allocator fails every
selector on it): the driver's "535.104.05" is published as 535.104.5, "12.4" as 12.4.0, as NVIDIA does.
"""

from __future__ import annotations

import re
from typing import Any

from nvidia_device_plugin.config.sharing_modes import NO_SHARING, sharing_mode
from nvidia_device_plugin.devices import Gpu, Inventory, MigDevice
from nvidia_device_plugin.dra.names import DraDevice
from nvidia_device_plugin.dra.sharing import PluginView
from nvidia_device_plugin.nvml.pci import sysfs_pci_name

STANDARD = "resource.kubernetes.io"
_NUMERIC = re.compile(r"[0-9]+")

Json = dict[str, Any]


def semver(text: str) -> str | None:
    """`text` as strict semver: "535.104.05" -> "535.104.5", "12.4" -> "12.4.0"; None when not numeric."""
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(_NUMERIC.fullmatch(p) for p in parts):
        return None
    return ".".join(str(int(p)) for p in [*parts, "0", "0"][:3])


def quantity(value: int) -> str:
    """A non-negative integer as a Kubernetes quantity in its canonical binary form: 85899345920 -> 80Gi."""
    for suffix, scale in (
        ("Ei", 1024**6),
        ("Pi", 1024**5),
        ("Ti", 1024**4),
        ("Gi", 1024**3),
        ("Mi", 1024**2),
    ):
        if value >= scale and value % scale == 0:
            return f"{value // scale}{suffix}"
    if value >= 1024 and value % 1024 == 0:
        return f"{value // 1024}Ki"
    return str(value)


def _put(attributes: Json, name: str, kind: str, value: object) -> None:
    if value is not None:
        attributes[name] = {kind: value}


def _gpu_attributes(gpu: Gpu, inventory: Inventory, topology: tuple[dict[int, str], dict[int, str]]) -> Json:
    """What a whole GPU and its MIG devices share (the parent's attributes)."""
    cuda = inventory.cuda_version
    nvlink, pcie = topology
    attributes: Json = {}
    _put(attributes, "productName", "string", gpu.name or None)
    _put(attributes, "brand", "string", gpu.brand)
    _put(attributes, "architecture", "string", gpu.architecture)
    cc = gpu.compute_capability
    _put(attributes, "cudaComputeCapability", "version", semver(f"{cc[0]}.{cc[1]}") if cc else None)
    _put(attributes, "driverVersion", "version", semver(inventory.driver_version))
    _put(attributes, "cudaDriverVersion", "version", semver(f"{cuda[0]}.{cuda[1]}") if cuda else None)
    _put(
        attributes,
        f"{STANDARD}/pciBusID",
        "string",
        sysfs_pci_name(gpu.pci_bus_id) if gpu.pci_bus_id else None,
    )
    _put(attributes, f"{STANDARD}/pcieRoot", "string", gpu.pcie_root)
    _put(attributes, f"{STANDARD}/numaNode", "int", gpu.numa_node)
    _put(attributes, "nvlinkDomain", "string", nvlink.get(gpu.index))
    _put(attributes, "pcieSwitch", "string", pcie.get(gpu.index))
    return attributes


def _mig_capacity(mig: MigDevice) -> Json:
    capacity: Json = {}
    attrs = mig.attributes
    if attrs is not None:
        for name, value in (
            ("multiprocessors", attrs.multiprocessors),
            ("copyEngines", attrs.copy_engines),
            ("decoders", attrs.decoders),
            ("encoders", attrs.encoders),
            ("jpegEngines", attrs.jpeg_decoders),
            ("ofaEngines", attrs.ofa_engines),
        ):
            capacity[name] = {"value": str(value)}
    capacity["memory"] = {"value": quantity(mig.memory_bytes)}
    return capacity


def device_entry(
    device: DraDevice,
    inventory: Inventory,
    topology: tuple[dict[int, str], dict[int, str]],
    view: PluginView | None,
) -> Json:
    """The `Device` of `device` (taints are added by the slice code, dra/slices.py)."""
    gpu, mig = device.gpu, device.mig
    attributes: Json = {"type": {"string": "gpu" if mig is None else "mig"}, "uuid": {"string": device.uuid}}
    if mig is not None:
        attributes["parentUUID"] = {"string": gpu.uuid}
        attributes["profile"] = {"string": mig.profile}
    attributes |= _gpu_attributes(gpu, inventory, topology)
    mode = sharing_mode(view.sharing) if view is not None else NO_SHARING
    shared = mode.dra_shareable
    attributes["resourceName"] = {"string": view.resource if view is not None else ""}
    attributes["sharing"] = {"string": mode.dra_attribute}
    capacity: Json = (
        _mig_capacity(mig) if mig is not None else {"memory": {"value": quantity(gpu.memory_bytes)}}
    )
    entry: Json = {"name": device.name, "attributes": attributes, "capacity": capacity}
    if shared and view is not None:
        # Consumable capacity (KEP-5075): each claim takes one share by default, and no memory unless it
        # asks, or the first claim would consume the whole GPU's memory and the second one fail.
        entry["allowMultipleAllocations"] = True
        capacity["shares"] = {
            "value": str(view.replicas),
            "requestPolicy": {
                "default": "1",
                "validRange": {"min": "1", "max": str(view.replicas), "step": "1"},
            },
        }
        capacity["memory"]["requestPolicy"] = {"default": "0", "validRange": {"min": "0"}}
    return entry

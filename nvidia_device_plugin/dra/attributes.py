"""One DRA device (resource.k8s.io/v1 `Device`) as this node publishes it: attributes and capacity.

Names and types are NVIDIA's DRA driver's, in its domain (`gpu.nvidia.com/<name>`, written without the
domain). Its kind (dra/kinds/) gives type, uuid, what only that kind has (a MIG device's parentUUID and
profile) and the capacity; every kind has its GPU's productName, brand, architecture, cudaComputeCapability,
driverVersion, cudaDriverVersion (the three as `version` values, so `semver()` selectors work). No `index`
(NVIDIA removed it: indices shift when a GPU drops). Kubernetes' standard attributes:
resource.kubernetes.io/pciBusID, pcieRoot and numaNode. Ours: nvlinkDomain and pcieSwitch
(dra/topology.py), resourceName and sharing (dra/sharing.py). An attribute NVML would not give is left
out; a device with list attributes, taints or counters counts against the smaller per-slice limit.

Versions are written strict semver (dra/values.py), or the API server would refuse the slice.
"""

from __future__ import annotations

from nvidia_device_plugin.config.sharing_modes import NO_SHARING, sharing_mode
from nvidia_device_plugin.devices import Gpu, Inventory
from nvidia_device_plugin.dra.kinds import DraDevice, Json
from nvidia_device_plugin.dra.sharing import PluginView
from nvidia_device_plugin.dra.values import semver
from nvidia_device_plugin.nvml.pci import sysfs_pci_name

STANDARD = "resource.kubernetes.io"
# The API server refuses a device with more attributes and capacities than this, and with it its slice.
MAX_ATTRIBUTES_AND_CAPACITIES = 32
_MEMORY_SLICE = "memorySlice"

__all__ = ["STANDARD", "Json", "device_entry"]


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


def device_entry(
    device: DraDevice,
    inventory: Inventory,
    topology: tuple[dict[int, str], dict[int, str]],
    view: PluginView | None,
) -> Json:
    """The `Device` of `device` (taints are added by the slice code, dra/slices.py)."""
    attributes = device.kind.attributes(device) | _gpu_attributes(device.gpu, inventory, topology)
    mode = sharing_mode(view.sharing) if view is not None else NO_SHARING
    shared = mode.dra_shareable
    attributes["resourceName"] = {"string": view.resource if view is not None else ""}
    attributes["sharing"] = {"string": mode.dra_attribute}
    capacity = device.kind.capacity(device)
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
    _fit_api_limit(attributes, capacity)
    return entry


def _fit_api_limit(attributes: Json, capacity: Json) -> None:
    """Leave out a MIG device's `memorySlice<N>` capacities where they would take it past the API's limit (a
    time-sliced 7g.80gb: 17 attributes, 7 capacities, 8 memory slices and `shares`): they only repeat
    where it sits, which its name says (`-<placement start>`) and its profile's size implies."""
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        for name in [n for n in capacity if n.startswith(_MEMORY_SLICE)]:
            del capacity[name]

"""What this node publishes: its DRA devices (those of the GPUs DRA owns), cut into ResourceSlices.

One pool per node (pool = node name, `nodeName` set), as the upstream kubelet plugin helper publishes
node-local devices. A slice holds at most 128 devices, and at most 64 once any device in it has taints,
counters or list attributes (the API server refuses more); devices keep their order (GPU, then MIG
order), so a change to one GPU touches one slice. The publisher (dra/publisher.py) sends these to the API
server; `dra plan` writes them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.dra.attributes import Json, device_entry
from nvidia_device_plugin.dra.names import DRIVER_NAME, published_devices
from nvidia_device_plugin.dra.sharing import plugin_views, view_of
from nvidia_device_plugin.dra.taints import HealthTaints
from nvidia_device_plugin.dra.topology import nvlink_domains, pcie_switches
from nvidia_device_plugin.plans.resources import ResourcePlan

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS = 64  # also with counters or list attributes; we publish neither


def node_devices(
    inventory: Inventory,
    plans: Sequence[ResourcePlan],
    owned: Collection[str],
    taints: HealthTaints | None = None,
) -> list[Json]:
    """The `Device` entries of the GPUs in `owned` (GPU UUIDs), with their taints."""
    topology = (nvlink_domains(inventory), pcie_switches(inventory))
    views = plugin_views(plans)
    devices = []
    for device in published_devices(inventory).values():
        if device.gpu.uuid not in owned:
            continue
        entry = device_entry(device, inventory, topology, view_of(device, views))
        device_taints = taints.taints(device) if taints is not None else []
        if device_taints:
            entry["taints"] = [t.to_json() for t in device_taints]
        devices.append(entry)
    return devices


def _limited(device: Json) -> bool:
    return bool(device.get("taints") or device.get("consumesCounters"))


def chunk_devices(devices: Sequence[Json]) -> list[list[Json]]:
    """`devices` in order, cut into slices no larger than the API allows; one empty slice for none (the
    pool then says, with its generation, that this node has no devices)."""
    chunks: list[list[Json]] = [[]]
    for device in devices:
        current = chunks[-1]
        limit = MAX_DEVICES_WITH_TAINTS if any(_limited(d) for d in [*current, device]) else MAX_DEVICES
        if len(current) >= limit:
            chunks.append([])
        chunks[-1].append(device)
    return chunks


def slice_spec(node: str, devices: list[Json], generation: int, count: int) -> Json:
    return {
        "driver": DRIVER_NAME,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
        "nodeName": node,
        "devices": devices,
    }


def owner_reference(node: str, uid: str) -> dict[str, Any]:
    """The Node owns its slices, so they go when the node object is deleted."""
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": True}


def planned_slices(node: str, devices: Sequence[Json]) -> list[Json]:
    """Whole ResourceSlice objects for a dry run (`dra plan`), named `<node>-gpu.nvidia.com-<n>`."""
    chunks = chunk_devices(devices)
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER_NAME}-{n}"},
            "spec": slice_spec(node, chunk, 1, len(chunks)),
        }
        for n, chunk in enumerate(chunks)
    ]

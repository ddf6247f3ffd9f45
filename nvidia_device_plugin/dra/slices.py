"""What this node publishes: its DRA devices (those of the GPUs DRA owns), cut into ResourceSlices.

One pool per node (pool = node name, `nodeName` set), as the upstream kubelet plugin helper publishes
node-local devices. A slice holds at most 128 devices, and at most 64 once any device in it has taints,
counters or list attributes (the API server refuses more); devices keep their order (GPU, then MIG
order), so a change to one GPU touches one slice. The publisher (dra/publisher.py) sends these to the API
server; `dra plan` writes them.

With dynamic MIG (dra/kinds/partition.py) each GPU that publishes partitions has a counter set; the counter
sets go in slices of their own, first, at most 8 to a slice (Kubernetes 1.35 on refuses a slice with both
`sharedCounters` and `devices`, and more than 8 sets in one; a consumer may name a set in any slice of its
pool), and the devices follow, 64 to a slice since they consume counters.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.dra.attributes import Json, device_entry
from nvidia_device_plugin.dra.kinds.partition import PARTITION, consumes_counters, counter_set
from nvidia_device_plugin.dra.names import DRIVER_NAME, kinds_of, published_devices
from nvidia_device_plugin.dra.sharing import plugin_views, view_of
from nvidia_device_plugin.dra.taints import HealthTaints
from nvidia_device_plugin.dra.topology import nvlink_domains, pcie_switches
from nvidia_device_plugin.plans.resources import ResourcePlan

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS = 64  # also with counters (dynamic MIG) or list attributes (we publish none)
MAX_COUNTER_SETS = 8  # counter sets in one slice


def node_devices(
    inventory: Inventory,
    plans: Sequence[ResourcePlan],
    owned: Collection[str],
    taints: HealthTaints | None = None,
    dynamic_mig: bool = False,
) -> list[Json]:
    """The `Device` entries of the GPUs in `owned` (GPU UUIDs), with their taints (and, with dynamic MIG,
    the counters each partition consumes)."""
    topology = (nvlink_domains(inventory), pcie_switches(inventory))
    views = plugin_views(plans)
    devices = []
    for device in published_devices(inventory, dynamic_mig).values():
        if device.gpu.uuid not in owned:
            continue
        entry = device_entry(device, inventory, topology, view_of(device, views))
        consumed = consumes_counters(device)
        if consumed:
            entry["consumesCounters"] = consumed
        device_taints = taints.taints(device) if taints is not None else []
        if device_taints:
            entry["taints"] = [t.to_json() for t in device_taints]
        devices.append(entry)
    return devices


def node_counter_sets(inventory: Inventory, owned: Collection[str], dynamic_mig: bool) -> list[Json]:
    """The counter sets of the GPUs in `owned` that publish partitions (none without dynamic MIG)."""
    return [
        counter_set(gpu)
        for gpu in sorted(inventory.gpus, key=lambda g: g.index)
        if gpu.uuid in owned and PARTITION in kinds_of(gpu, dynamic_mig)
    ]


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


def slice_contents(devices: Sequence[Json], counter_sets: Sequence[Json] = ()) -> list[Json]:
    """What each of the node's slices holds: `{"sharedCounters": [...]}` slices first (none without
    counter sets), then `{"devices": [...]}` ones (chunk_devices)."""
    counters = [
        {"sharedCounters": list(counter_sets[i : i + MAX_COUNTER_SETS])}
        for i in range(0, len(counter_sets), MAX_COUNTER_SETS)
    ]
    return [*counters, *({"devices": chunk} for chunk in chunk_devices(devices))]


def content_names(content: Json) -> frozenset[str]:
    """What a slice holds, by name: its devices' names, or its counter sets' ("counters:" before each)."""
    devices = content.get("devices") or []
    sets = content.get("sharedCounters") or []
    return frozenset([str(d["name"]) for d in devices] + [f"counters:{s['name']}" for s in sets])


def slice_spec(node: str, content: Json, generation: int, count: int) -> Json:
    return {
        "driver": DRIVER_NAME,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
        "nodeName": node,
        **content,
    }


def owner_reference(node: str, uid: str) -> dict[str, Any]:
    """The Node owns its slices, so they go when the node object is deleted."""
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": True}


def planned_slices(node: str, devices: Sequence[Json], counter_sets: Sequence[Json] = ()) -> list[Json]:
    """Whole ResourceSlice objects for a dry run (`dra plan`), named `<node>-gpu.nvidia.com-<n>`."""
    contents = slice_contents(devices, counter_sets)
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER_NAME}-{n}"},
            "spec": slice_spec(node, content, 1, len(contents)),
        }
        for n, content in enumerate(contents)
    ]

"""How the published ResourceSlices move to the wanted ones: the upstream resourceslice controller's rules
(k8s.io/dynamic-resource-allocation/resourceslice), as a pure plan of API calls.

* The pool's generation is the highest any existing slice has; slices of a lower one are obsolete.
* An existing slice matches a wanted one when they hold the same device names (or the same counter sets,
  or when there is one of each); an existing slice that matches none is obsolete.
* The generation stays when at most one matched slice changes and none is new (one update is atomic);
  otherwise it goes up by one and every matched slice is rewritten with it, so consumers, who use only
  the highest generation, never see a pool half old and half new.
* New slices are created with generateName `<node>-gpu.nvidia.com-`, owned by the Node; obsolete ones
  deleted with their UID and resourceVersion as preconditions. Calls go updates, creates, deletes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nvidia_device_plugin.dra.attributes import Json
from nvidia_device_plugin.dra.names import DRIVER_NAME
from nvidia_device_plugin.dra.slices import API_VERSION, content_names, owner_reference, slice_spec


@dataclass
class SyncPlan:
    updates: list[Json] = field(default_factory=list)  # whole objects, with their resourceVersion
    creates: list[Json] = field(default_factory=list)
    deletes: list[tuple[str, str, str]] = field(default_factory=list)  # (name, uid, resourceVersion)
    generation: int = 0

    @property
    def empty(self) -> bool:
        return not (self.updates or self.creates or self.deletes)


def _generation(obj: Json) -> int:
    return int(obj["spec"]["pool"]["generation"])


def _same(stored: Json, wanted: Json) -> bool:
    """Whether a stored spec says what `wanted` says (fields the server added are not ours to compare)."""
    return all(stored.get(key) == value for key, value in wanted.items())


def _match(current: list[Json], chunks: Sequence[Json]) -> tuple[dict[int, Json], list[Json]]:
    """Wanted slice index -> the existing slice it matches, and the existing slices matching none."""
    if len(current) == 1 and len(chunks) == 1:
        return {0: current[0]}, []
    matched: dict[int, Json] = {}
    unmatched = []
    for obj in current:
        names = content_names(obj["spec"])
        free = (i for i, c in enumerate(chunks) if i not in matched and content_names(c) == names)
        index = next(free, None)
        if index is None:
            unmatched.append(obj)
        else:
            matched[index] = obj
    return matched, unmatched


def plan_sync(existing: Sequence[Json], chunks: Sequence[list[Json]], node: str, node_uid: str) -> SyncPlan:
    """The calls that make `existing` (this node's slices of our driver) publish `chunks` of devices."""
    return plan_contents_sync(existing, [{"devices": chunk} for chunk in chunks], node, node_uid)


def plan_contents_sync(
    existing: Sequence[Json], chunks: Sequence[Json], node: str, node_uid: str
) -> SyncPlan:
    """The calls that make `existing` (this node's slices of our driver) publish `chunks`, what each slice
    holds (dra/slices.py's `slice_contents`: devices, or counter sets)."""
    generation = max((_generation(s) for s in existing), default=0)
    obsolete = [s for s in existing if _generation(s) < generation]
    current = [s for s in existing if _generation(s) >= generation]
    matched, unmatched = _match(current, chunks)
    obsolete += unmatched
    count = len(chunks)
    changed = {
        i
        for i, obj in matched.items()
        if not _same(obj["spec"], slice_spec(node, chunks[i], generation, count))
    }
    new = count - len(matched)
    bumped = not (new == 0 and len(changed) <= 1)
    if bumped:
        generation += 1
    plan = SyncPlan(generation=generation)
    for i, obj in sorted(matched.items()):
        if i in changed or bumped:
            plan.updates.append({**obj, "spec": slice_spec(node, chunks[i], generation, count)})
    for i, chunk in enumerate(chunks):
        if i not in matched:
            plan.creates.append(_new_slice(node, node_uid, slice_spec(node, chunk, generation, count)))
    for obj in obsolete:
        meta = obj["metadata"]
        plan.deletes.append((meta["name"], meta.get("uid", ""), meta.get("resourceVersion", "")))
    return plan


def _new_slice(node: str, node_uid: str, spec: Json) -> Json:
    metadata: dict[str, Any] = {"generateName": f"{node}-{DRIVER_NAME}-"}
    if node_uid:
        metadata["ownerReferences"] = [owner_reference(node, node_uid)]
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": metadata, "spec": spec}

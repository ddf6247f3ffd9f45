"""The kubelet stand-in's device manager: what it keeps per resource, its node-status ticks, and admission.

It follows kubelet's device manager (v1.36) where a plugin can see the difference:

* A ListAndWatch message replaces the devices of its resource, by resource name (whichever client sent it).
* When a resource's client is disconnected, every device of the resource turns Unhealthy and its endpoint
  gets a stop time. Kubelet never dials the plugin again: only a new Register brings the resource back.
* Capacity and allocatable are recomputed only at node-status ticks (every 10 s); a resource whose endpoint
  has been stopped for longer than the grace period (5 minutes) is removed at the next tick.
* Admission asks for devices the way `devicesToAllocate` does: the healthy free devices; with a topology
  manager policy such as `single-numa-node`, only those of the NUMA node the topology manager chose (the
  lowest that has enough), and when exactly the requested number is aligned they are taken without asking
  GetPreferredAllocation. Every failure reaches the pod as
  `UnexpectedAdmissionError: Allocate failed due to <inner>, which is unexpected`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import grpc

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb

NODE_STATUS_INTERVAL_S = 10.0  # kubelet's nodeStatusUpdateFrequency
ENDPOINT_STOP_GRACE_S = 300.0  # kubelet's endpointStopGracePeriod
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

TopologyPolicy = Literal["none", "single-numa-node"]

# grpc-go's names of the codes a plugin answers with, as kubelet quotes them ("rpc error: code = ...").
_GO_CODE_NAMES = {grpc.StatusCode.CANCELLED: "Canceled"}


@dataclass
class ResourceState:
    """One resource as kubelet's device manager holds it (healthy/unhealthy devices, stop time, status)."""

    devices: dict[str, pb.Device] = field(default_factory=dict)
    allocated: set[str] = field(default_factory=set)  # by admitted pods; survives re-registration
    stopped_at: float | None = None  # time.monotonic() when its endpoint stopped; None while connected
    capacity: int = 0  # as of the last node-status tick
    allocatable: int = 0

    def mark_unhealthy(self) -> None:
        """Kubelet's markResourceUnhealthy: every device of the resource, whatever the plugin said."""
        for device_id, device in self.devices.items():
            if device.health != UNHEALTHY:
                marked = pb.Device()
                marked.CopyFrom(device)
                marked.health = UNHEALTHY
                self.devices[device_id] = marked

    def healthy_free(self) -> list[pb.Device]:
        return sorted(
            (d for d in self.devices.values() if d.health == HEALTHY and d.ID not in self.allocated),
            key=lambda d: d.ID,
        )


def node_status_tick(resources: dict[str, ResourceState], now: float, grace_s: float) -> list[str]:
    """Kubelet's GetCapacity at a node-status tick: expired resources removed (returned), the rest counted."""
    removed = []
    for name, state in list(resources.items()):
        if state.stopped_at is not None and now - state.stopped_at > grace_s:
            del resources[name]
            removed.append(name)
            continue
        state.capacity = len(state.devices)
        state.allocatable = sum(1 for d in state.devices.values() if d.health == HEALTHY)
    return removed


class AdmissionError(Exception):
    """The pod is rejected; the message is what the pod's status says (`<reason>: <message>`)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


def unexpected(inner: str) -> AdmissionError:
    """How kubelet wraps every device-manager failure at admission."""
    return AdmissionError("UnexpectedAdmissionError", f"Allocate failed due to {inner}, which is unexpected")


def rpc_failure(exc: grpc.RpcError) -> str:
    """A failed call as grpc-go prints it, the inner error kubelet quotes."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    name = _GO_CODE_NAMES.get(code) or "".join(part.capitalize() for part in code.name.split("_"))
    return f"rpc error: code = {name} desc = {details}"


def numa_nodes(device: pb.Device) -> set[int]:
    return {n.ID for n in device.topology.nodes}


def aligned_devices(free: Sequence[pb.Device], count: int, policy: TopologyPolicy) -> list[str] | None:
    """The devices the topology manager lets the pod have: None without a policy (no alignment), else the
    free devices of the lowest NUMA node that has `count` of them. AdmissionError when none has."""
    if policy == "none":
        return None
    by_node: dict[int, list[str]] = {}
    for device in free:
        nodes = numa_nodes(device)
        if len(nodes) == 1:
            by_node.setdefault(next(iter(nodes)), []).append(device.ID)
    for node in sorted(by_node):
        if len(by_node[node]) >= count:
            return by_node[node]
    raise AdmissionError("TopologyAffinityError", "Resources cannot be allocated with Topology locality")


def take_preferred(preferred: Sequence[str], offered: Sequence[str], count: int) -> list[str]:
    """Kubelet keeps the preferred IDs it offered, then tops up from the offered ones in order."""
    allowed = set(offered)
    chosen = list(dict.fromkeys(i for i in preferred if i in allowed))[:count]
    taken = set(chosen)
    chosen += [i for i in offered if i not in taken][: count - len(chosen)]
    return chosen


AskPreferred = Callable[[Sequence[str], Sequence[str], int], list[str]]  # (available, must_include, size)
Allocate = Callable[[Sequence[Sequence[str]]], pb.AllocateResponse]


def admit_container(
    resource: str,
    free: Sequence[pb.Device],
    count: int,
    policy: TopologyPolicy,
    ask_preferred: AskPreferred | None,
    allocate: Allocate,
) -> tuple[list[str], pb.ContainerAllocateResponse]:
    """devicesToAllocate, then Allocate, for one container; AdmissionError as kubelet words it."""
    if len(free) < count:
        raise unexpected(
            f"requested number of devices unavailable for {resource}. "
            f"Requested: {count}, Available: {len(free)}"
        )
    aligned = aligned_devices(free, count, policy)
    offered = aligned if aligned is not None else [d.ID for d in free]
    try:
        if aligned is not None and len(aligned) == count:
            chosen = aligned  # exactly enough aligned devices: taken without asking the plugin
        elif ask_preferred is not None:
            chosen = take_preferred(ask_preferred(offered, [], count), offered, count)
        else:
            chosen = offered[:count]
        response = allocate([chosen])
    except grpc.RpcError as exc:
        raise unexpected(rpc_failure(exc)) from exc
    except ValueError as exc:  # the closed channel of a disconnected endpoint
        raise unexpected(f"rpc error: code = Unavailable desc = {exc}") from exc
    return chosen, response.container_responses[0]


def preferred_request(
    available: Sequence[str], must_include: Sequence[str], size: int
) -> pb.PreferredAllocationRequest:
    """kubelet's GetPreferredAllocation request for one container."""
    container = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size
    )
    return pb.PreferredAllocationRequest(container_requests=[container])

"""Kubelet's pod-resources API (podresources/v1 `List`): which devices running pods hold right now.

The handover reads it before a GPU changes sides (dra/ownership.py): the device-plugin IDs assigned to
containers (`devices`: resource name and IDs, our `<uuid>` and `<uuid>::<n>`), and the DRA devices of
their claims (`dynamic_resources`: driver, pool, device name). Every call is bounded: a deadline, a
largest message (kubelet's own limit, 16 MiB), and one channel per reading, closed after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from nvidia_device_plugin.api.podresources.v1 import api_pb2, api_pb2_grpc
from nvidia_device_plugin.base.errors import DevicePluginError

DEADLINE_S = 5.0
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # kubelet's podresources.DefaultMaxMsgSize


class PodResourcesError(DevicePluginError):
    """The pod-resources socket could not be read (the message says why)."""


@dataclass(frozen=True)
class PodDevices:
    """What running pods hold: device-plugin IDs by resource, and DRA devices as (driver, pool, device)."""

    plugin_ids: dict[str, frozenset[str]]
    dra_devices: frozenset[tuple[str, str, str]]


def list_pod_devices(socket: Path, deadline_s: float = DEADLINE_S) -> PodDevices:
    """One `List` call on kubelet's pod-resources socket; raises PodResourcesError when it fails."""
    if not socket.exists():
        raise PodResourcesError(
            f"kubelet's pod-resources socket {socket} does not exist (mount /var/lib/kubelet/pod-resources "
            "into the pod, or give --pod-resources-socket)"
        )
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    try:
        with grpc.insecure_channel(f"unix://{socket}", options=options) as channel:
            stub = api_pb2_grpc.PodResourcesListerStub(channel)
            response = stub.List(api_pb2.ListPodResourcesRequest(), timeout=deadline_s)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        raise PodResourcesError(
            f"kubelet's pod-resources List on {socket} failed: {code}: {details}"
        ) from None
    ids: dict[str, set[str]] = {}
    dra: set[tuple[str, str, str]] = set()
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                ids.setdefault(devices.resource_name, set()).update(devices.device_ids)
            for dynamic in container.dynamic_resources:
                dra.update((r.driver_name, r.pool_name, r.device_name) for r in dynamic.claim_resources)
    return PodDevices({name: frozenset(v) for name, v in ids.items()}, frozenset(dra))

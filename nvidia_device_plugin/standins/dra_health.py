"""Kubelet's side of the DRA health stream (dra-health NodeWatchResources), as a stand-in.

`HealthWatch` dials a DRA plugin's endpoint, opens the stream as kubelet's DRA plugin manager does (in the
version given: v1, v1beta1 or v1alpha1, each with its own generated client and types; `pick_health_service`
picks from a registration's supported versions as kubelet does), and
keeps every message on a thread of its own ("dra-health-watch"): `latest()` is the last full list, as
(pool, device) -> `SeenHealth`; `wait_for` waits for a condition on it. `close()` cancels the call (the
client going away, as a restarting kubelet does) and joins the thread. For tests, demo and bench.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from nvidia_device_plugin.api.dra_health.v1 import api_pb2 as v1_pb
from nvidia_device_plugin.api.dra_health.v1 import api_pb2_grpc as v1_grpc
from nvidia_device_plugin.api.dra_health.v1alpha1 import api_pb2 as v1alpha1_pb
from nvidia_device_plugin.api.dra_health.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from nvidia_device_plugin.api.dra_health.v1beta1 import api_pb2 as v1beta1_pb
from nvidia_device_plugin.api.dra_health.v1beta1 import api_pb2_grpc as v1beta1_grpc


@dataclass(frozen=True)
class _Client:
    """One version's generated client: its stub, its request, and its HealthStatus names."""

    stub: Callable[[grpc.Channel], Any]
    request: Callable[[], Message]
    status_name: Callable[[int], str]


# Kubelet's preference, most preferred first: 1.37+ takes v1 over v1alpha1 wherever the plugin lists them.
_CLIENTS = {
    "v1.DRAResourceHealth": _Client(
        v1_grpc.DRAResourceHealthStub, v1_pb.NodeWatchResourcesRequest, v1_pb.HealthStatus.Name
    ),
    "v1beta1.DRAResourceHealth": _Client(
        v1beta1_grpc.DRAResourceHealthStub, v1beta1_pb.NodeWatchResourcesRequest, v1beta1_pb.HealthStatus.Name
    ),
    "v1alpha1.DRAResourceHealth": _Client(
        v1alpha1_grpc.DRAResourceHealthStub,
        v1alpha1_pb.NodeWatchResourcesRequest,
        v1alpha1_pb.HealthStatus.Name,
    ),
}
HEALTH_SERVICES = tuple(_CLIENTS)


def pick_health_service(supported_versions: Sequence[str]) -> str | None:
    """The health service kubelet opens for a registration listing `supported_versions` (None: none)."""
    return next((service for service in _CLIENTS if service in supported_versions), None)


@dataclass(frozen=True)
class SeenHealth:
    """One device's entry of a message, as kubelet reads it."""

    health: str  # "HEALTHY", "UNHEALTHY" or "UNKNOWN"
    message: str
    last_updated_time: int
    health_check_timeout_seconds: int


Devices = dict[tuple[str, str], SeenHealth]


class HealthWatch:
    """A NodeWatchResources stream of `service` (one of HEALTH_SERVICES) on the endpoint `socket`, read until
    `close()` or its end."""

    def __init__(self, socket: Path, service: str = HEALTH_SERVICES[0]) -> None:
        if service not in _CLIENTS:
            raise ValueError(f"unknown DRA health service {service!r}; known: {list(_CLIENTS)}")
        self._client = _CLIENTS[service]
        self._channel = grpc.insecure_channel(f"unix:{socket}")
        self._call = self._client.stub(self._channel).NodeWatchResources(self._client.request())
        self._changed = threading.Condition()
        self.messages: list[Devices] = []
        self.error: grpc.StatusCode | None = None  # how the stream ended, unless closed by us
        self.ended = False
        self._thread = threading.Thread(target=self._read, name="dra-health-watch", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for response in self._call:
                devices = {
                    (d.device.pool_name, d.device.device_name): SeenHealth(
                        self._client.status_name(d.health),
                        d.message,
                        d.last_updated_time,
                        d.health_check_timeout_seconds,
                    )
                    for d in response.devices
                }
                with self._changed:
                    self.messages.append(devices)
                    self._changed.notify_all()
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
            with self._changed:
                self.error = None if code is grpc.StatusCode.CANCELLED else code
        finally:
            with self._changed:
                self.ended = True
                self._changed.notify_all()

    def latest(self) -> Devices:
        """The last full list received (empty before the first)."""
        with self._changed:
            return dict(self.messages[-1]) if self.messages else {}

    def wait_for(self, predicate: Callable[[HealthWatch], bool], timeout: float) -> bool:
        """Wait until predicate(self) holds (checked at each message and when the stream ends)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.1))
            return True

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(10)
        self._channel.close()

    def __enter__(self) -> HealthWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Kubelet's side of the DRA health stream (dra-health/v1alpha1 NodeWatchResources), as a stand-in.

`HealthWatch` dials a DRA plugin's endpoint, opens the stream as kubelet's DRA plugin manager does, and
keeps every message on a thread of its own ("dra-health-watch"): `latest()` is the last full list, as
(pool, device) -> `SeenHealth`; `wait_for` waits for a condition on it. `close()` cancels the call (the
client going away, as a restarting kubelet does) and joins the thread. For tests, demo and bench.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from nvidia_device_plugin.api.dra_health.v1alpha1 import api_pb2 as health_pb
from nvidia_device_plugin.api.dra_health.v1alpha1 import api_pb2_grpc as health_grpc


@dataclass(frozen=True)
class SeenHealth:
    """One device's entry of a message, as kubelet reads it."""

    health: str  # "HEALTHY", "UNHEALTHY" or "UNKNOWN"
    message: str
    last_updated_time: int
    health_check_timeout_seconds: int


Devices = dict[tuple[str, str], SeenHealth]


class HealthWatch:
    """A NodeWatchResources stream on the endpoint `socket`, read until `close()` or its end."""

    def __init__(self, socket: Path) -> None:
        self._channel = grpc.insecure_channel(f"unix:{socket}")
        self._call = health_grpc.DRAResourceHealthStub(self._channel).NodeWatchResources(
            health_pb.NodeWatchResourcesRequest()
        )
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
                        health_pb.HealthStatus.Name(d.health),
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

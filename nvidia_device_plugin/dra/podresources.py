"""Kubelet's pod-resources API (podresources/v1 `List`): which devices running pods hold right now.

The handover reads it before a GPU changes sides (dra/ownership.py): the device-plugin IDs assigned to
containers (`devices`: resource name and IDs, our `<uuid>` and `<uuid>::<n>`), and the DRA devices of
their claims (`dynamic_resources`: driver, pool, device name). Every call is bounded: a deadline, a
largest message (kubelet's own limit, 16 MiB), and one channel per reading, closed after it.

A kubelet that just came back is not believed at once: after a restart it serves pod-resources before it
has its pods back (they come from the API server and its static pod files), so for a while it answers that
no pod holds anything. `PodResourcesReader` therefore trusts a socket's answers only once the socket (its
device, inode and mtime: kubelet makes a new one at each start) has existed for `grace_s`, or, after a
reading that failed, once it has answered again for `grace_s`. Until then a reading raises
`KubeletRestarting`, and the handover moves nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
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


class KubeletRestarting(PodResourcesError):
    """Kubelet answered, but too soon after it (re)started or failed for its answer to be complete."""


class PodResourcesReader:
    """Readings of kubelet's pod-resources socket that the handover may trust (see the module's doc).

    `grace_s`: how long a new socket, or one that answers again after a failed reading, must have been
    there before its answers count; `clock` (monotonic) and `wall_clock` (to compare with the socket's
    mtime) are for tests.
    """

    def __init__(
        self,
        socket: Path,
        grace_s: float,
        deadline_s: float = DEADLINE_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.socket = socket
        self.grace_s = grace_s
        self._deadline_s = deadline_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._identity: tuple[int, int, int] | None = None  # the socket the last good reading came from
        self._failed = False
        self._trusted_from = 0.0  # on `clock`

    def read(self) -> PodDevices:
        """What running pods hold; PodResourcesError when kubelet does not answer, KubeletRestarting when
        its answer cannot be trusted yet."""
        try:
            before = _identity(self.socket)
            pods = list_pod_devices(self.socket, self._deadline_s)
            after = _identity(self.socket)
        except PodResourcesError:
            self._failed = True
            raise
        now = self._clock()
        if self._failed or before != after or after != self._identity:
            # A socket first seen counts from its mtime (kubelet may have started long before us); one
            # replaced during the call, or answering after a failure, counts from now.
            fresh = self._failed or before != after
            age = 0.0 if fresh else min(self.grace_s, max(0.0, self._wall_clock() - after[2] / 1e9))
            self._trusted_from = now + self.grace_s - age
        self._failed, self._identity = False, after
        if now < self._trusted_from:
            raise KubeletRestarting(
                f"kubelet's pod-resources socket {self.socket} is new, or answers again after a failed "
                f"reading: its answers count once it has answered for {self.grace_s:g} s (kubelet restores "
                "its pods first; --dra-kubelet-restart-grace)"
            )
        return pods


def _identity(socket: Path) -> tuple[int, int, int]:
    try:
        info = os.stat(socket)
    except OSError as exc:
        problem = (
            "does not exist" if isinstance(exc, FileNotFoundError) else f"cannot be read: {exc.strerror}"
        )
        raise PodResourcesError(
            f"kubelet's pod-resources socket {socket} {problem} (mount /var/lib/kubelet/pod-resources into "
            "the pod, or give --pod-resources-socket)"
        ) from None
    return info.st_dev, info.st_ino, info.st_mtime_ns

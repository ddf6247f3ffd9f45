"""Serving one ResourcePlan through the framework: health-aware device lists, Allocate and preferences.

An MPS plan is also gated on its GPUs' control daemons (`mps_gate`, sharing/readiness.py): a replica is
Healthy only while its GPU is healthy AND its MPS daemon is ready, and Allocate refuses the others. That
gate is kept apart from the health registry on purpose: readiness comes and goes with a daemon in another
pod, while the registry's faults are the GPU's own (first reason wins, recovery by grace period).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.base.errors import AllocationError
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.health.registry import HealthRegistry
from nvidia_device_plugin.plans.resources import ResourcePlan
from nvidia_device_plugin.plugin.server import DeviceState
from nvidia_device_plugin.serving.allocate import AllocationIndex, AllocationSettings, allocate
from nvidia_device_plugin.serving.preferred import preferred_allocation

# GetPreferredAllocation is the one call whose work grows with the request (kubelet offers every free ID,
# 5,600 on a large node). Kubelet sends one at a time; four clients looping them took the CPU Allocate
# needed (its median 74x). So, per resource:
# * one computation at a time; at most PREFERRED_WAITING more calls wait for their turn (holding a worker
#   thread each, never the CPU: the other workers stay free for Allocate), each for at most
#   PREFERRED_WAIT_S; past either bound the call is refused, naming it;
# * after a computation of t seconds the next one starts no sooner than PREFERRED_REST x t later (at most
#   PREFERRED_MAX_REST_S): back-to-back calls get at most a quarter of a core, and Allocate the rest. A
#   call that finds no computation recent (kubelet's, one per pod) starts at once.
PREFERRED_WAITING = 2
PREFERRED_WAIT_S = 5.0
PREFERRED_REST = 3.0
PREFERRED_MAX_REST_S = 1.0


class OneAtATime:
    """One holder of turn() at a time, spaced by `rest` x the last turn's length; `waiting` more callers
    wait up to `wait_s` seconds for theirs, others are refused."""

    def __init__(
        self,
        what: str,
        waiting: int,
        wait_s: float,
        rest: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._what = what
        self._waiting = waiting
        self._wait_s = wait_s
        self._rest = rest
        self._clock = clock
        self._sleep = sleep
        self._admitted_lock = threading.Lock()
        self._admitted = 0  # calls in turn(): the one running and those waiting for their turn
        self._running = threading.Lock()
        self._rested_at = 0.0  # when the next turn may start (clock time)

    @contextmanager
    def turn(self) -> Iterator[None]:
        """AllocationError when the running one and `waiting` others are there already, or the wait ends."""
        with self._admitted_lock:
            if (refused := self.refusal()) is not None:
                raise AllocationError(refused)
            self._admitted += 1
        try:
            if not self._running.acquire(timeout=self._wait_s):
                raise AllocationError(
                    f"{self._what}: waited {self._wait_s:g} s for the one computed before it (one at a time "
                    "per resource; kubelet sends one at a time)"
                )
            try:
                resting = self._rested_at - self._clock()
                if resting > 0:
                    self._sleep(min(resting, PREFERRED_MAX_REST_S))
                started = self._clock()
                try:
                    yield
                finally:
                    ended = self._clock()
                    self._rested_at = ended + self._rest * (ended - started)
            finally:
                self._running.release()
        finally:
            with self._admitted_lock:
                self._admitted -= 1

    def refusal(self) -> str | None:
        """Why turn() would refuse a call at once now, None when it would not: a look that takes no turn (the
        server refuses so before parsing a request, to keep a flood's refused calls cheap)."""
        if self._admitted < 1 + self._waiting:
            return None
        return (
            f"{self._what}: 1 computing and {self._waiting} waiting already, the most at once "
            "(one at a time per resource; kubelet sends one at a time)"
        )


class MpsGate(Protocol):
    def not_ready_reason(self, resource: str, gpu_uuid: str) -> str | None: ...


class GpuResourceBackend:
    """ResourceBackend for one advertised NVIDIA resource."""

    def __init__(
        self,
        plan: ResourcePlan,
        inventory: Inventory,
        settings: AllocationSettings,
        registry: HealthRegistry,
        mps_gate: MpsGate | None = None,
        preferred_wait_s: float = PREFERRED_WAIT_S,
    ) -> None:
        self.plan = plan
        self.inventory = inventory
        self.settings = settings
        self.registry = registry
        self._index = AllocationIndex(plan, inventory)
        self._mps_gate = mps_gate
        self._preferred_turns = OneAtATime(
            f"GetPreferredAllocation for {plan.name}", PREFERRED_WAITING, preferred_wait_s, PREFERRED_REST
        )

    def devices(self) -> Sequence[DeviceState]:
        healthy = self.registry.is_healthy
        gate = self._mps_gate
        if gate is None:
            return [DeviceState(d.id, healthy(d), d.numa_node) for d in self.plan.devices]
        name = self.plan.name
        ready = {
            u: gate.not_ready_reason(name, u) is None for u in {d.physical_uuid for d in self.plan.devices}
        }
        return [
            DeviceState(d.id, healthy(d) and ready[d.physical_uuid], d.numa_node) for d in self.plan.devices
        ]

    def allocate(self, requests: Sequence[Sequence[str]]) -> pb.AllocateResponse:
        if self._mps_gate is not None:
            self._check_mps_ready(requests)
        # The registry is asked per requested device; no copy of the unhealthy map.
        return allocate(self._index, requests, self.settings, self.registry)

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        with self._preferred_turns.turn():
            return preferred_allocation(
                self.plan,
                self.inventory,
                available,
                must_include,
                size,
                policy=self.settings.shared_devices_allocation_policy,
            )

    def preferred_refusal(self) -> str | None:
        """Why a GetPreferredAllocation would be refused at once now (its bound reached), None otherwise."""
        return self._preferred_turns.refusal()

    def _check_mps_ready(self, requests: Sequence[Sequence[str]]) -> None:
        assert self._mps_gate is not None
        for i, ids in enumerate(requests):
            for device_id in ids:
                dev = self._index.device(device_id)
                if dev is None or dev.replica is None:
                    continue  # unknown IDs and unshared GPUs: allocate() answers those
                reason = self._mps_gate.not_ready_reason(self.plan.name, dev.physical_uuid)
                if reason is not None:
                    raise AllocationError(
                        f"container_requests[{i}]: device '{device_id}' cannot be allocated: the MPS control "
                        f"daemon of {dev.label} is not ready: {reason}"
                    )

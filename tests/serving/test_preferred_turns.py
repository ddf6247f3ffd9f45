"""GetPreferredAllocation computed one at a time per resource (issue 32 item 9: four clients looping
3-container requests of 2,800 IDs took Allocate's median 74x). Counted, never timed: how many
computations run at once, and which calls are refused and why.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from nvidia_device_plugin.base.errors import AllocationError
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.devices import Gpu, Inventory
from nvidia_device_plugin.health.registry import HealthRegistry
from nvidia_device_plugin.plans.resources import AdvertisedDevice, ResourcePlan, replica_id
from nvidia_device_plugin.serving import backend as backend_module
from nvidia_device_plugin.serving.allocate import AllocationSettings
from nvidia_device_plugin.serving.backend import GpuResourceBackend, OneAtATime
from nvidia_device_plugin.serving.preferred import preferred_allocation

from support.checks import assert_all
from support.waiting import scaled, wait_for

GIB = 1024**3
GPUS, REPLICAS = 4, 10


def _backend(preferred_wait_s: float = backend_module.PREFERRED_WAIT_S) -> GpuResourceBackend:
    uuids = [f"GPU-{g:02d}" for g in range(GPUS)]
    inventory = Inventory(
        gpus=tuple(
            Gpu(g, u, "NVIDIA A100", 80 * GIB, f"00000000:{g:02x}:00.0", g, 0, False)
            for g, u in enumerate(uuids)
        )
    )
    plan = ResourcePlan(
        "nvidia.com/gpu",
        tuple(
            AdvertisedDevice(replica_id(u, r), "gpu", u, u, g, None, r, 0, 80 * GIB)
            for g, u in enumerate(uuids)
            for r in range(REPLICAS)
        ),
        sharing="time-slicing",
        replicas=REPLICAS,
    )
    settings = AllocationSettings.from_config(Config())
    return GpuResourceBackend(plan, inventory, settings, HealthRegistry(), preferred_wait_s=preferred_wait_s)


class _Gated:
    """preferred_allocation, held inside until `release` is set; counts the computations in flight."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0

    def __call__(self, *args: Any, **kwargs: Any) -> list[str]:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            assert self.release.wait(scaled(60)), "the test never released the computation"
            return preferred_allocation(*args, **kwargs)
        finally:
            with self.lock:
                self.running -= 1


def test_one_computation_at_a_time_two_waiting_the_rest_refused_naming_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gated = _Gated()
    monkeypatch.setattr(backend_module, "preferred_allocation", gated)
    backend = _backend(preferred_wait_s=60.0)  # waiters outlast any slow machine
    available = [d.id for d in backend.plan.devices]
    answers: list[list[str]] = []
    refusals: list[str] = []
    lock = threading.Lock()

    def call() -> None:
        try:
            ids = backend.preferred_allocation(available, [], 4)
        except AllocationError as exc:
            with lock:
                refusals.append(str(exc))
            return
        with lock:
            answers.append(ids)

    threads = [threading.Thread(target=call, name=f"preferred-{n}") for n in range(6)]
    for thread in threads:
        thread.start()
    # One computes, two wait for their turn, the other three are refused at once.
    wait_for(lambda: gated.running == 1 and len(refusals) == 3, "three calls refused while one computes")
    gated.release.set()
    for thread in threads:
        thread.join(scaled(60))
    assert gated.most == 1  # was 6: every caller computed at once
    assert len(answers) == 3 and all(len(ids) == 4 for ids in answers)
    assert_all(refusals, lambda r: "1 computing and 2 waiting already" in r and "nvidia.com/gpu" in r)


def test_a_caller_waits_only_so_long_for_its_turn() -> None:
    turns = OneAtATime("GetPreferredAllocation for nvidia.com/gpu", waiting=1, wait_s=0.01)
    with turns.turn():
        outcome: list[str] = []

        def late() -> None:
            try:
                with turns.turn():
                    outcome.append("computed")
            except AllocationError as exc:
                outcome.append(str(exc))

        thread = threading.Thread(target=late, name="preferred-late")
        thread.start()
        thread.join(scaled(60))
    assert len(outcome) == 1 and "waited 0.01 s for the one computed before it" in outcome[0]
    with turns.turn():  # the bound is given back: the next caller computes
        pass


def test_back_to_back_computations_rest_three_times_as_long_as_the_last_took() -> None:
    now = [100.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    turns = OneAtATime(
        "GetPreferredAllocation for nvidia.com/gpu", 2, 5.0, rest=3.0, clock=lambda: now[0], sleep=sleep
    )
    with turns.turn():  # the first computation starts at once, and takes 0.1 s
        now[0] += 0.1
    with turns.turn():  # the next one, right after: rests 0.3 s first, then takes 0.01 s
        now[0] += 0.01
    now[0] += 1.0  # a call long after (kubelet's next pod): starts at once
    with turns.turn():
        pass
    assert slept == [pytest.approx(0.3)]
    with turns.turn():  # right after a computation of no time: no rest; this one takes 2 s
        now[0] += 2.0
    with turns.turn():  # 6 s of rest are owed, capped at PREFERRED_MAX_REST_S
        pass
    assert slept == [pytest.approx(0.3), backend_module.PREFERRED_MAX_REST_S]

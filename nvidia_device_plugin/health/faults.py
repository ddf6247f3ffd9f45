"""The devices one health monitor marked unhealthy: liveness checks, and recovery when it is on.

Kept apart from the event loop (health/monitor.py) because it is its own job: given "this device had a
fault" and the clock, decide when a device is lost, when it is readable again, and when it may return to
service. The rules (see health/monitor.py for where they depart from NVIDIA's plugin):

* Every GPU is probed on each liveness check (handle by UUID, UUID, memory info). GPU_IS_LOST and
  NOT_FOUND mean lost at once; any other failure means lost only after LOST_AFTER_FAILED_PROBES
  consecutive failed checks, so one transient NVML_ERROR_UNKNOWN does not take a GPU out for good.
* With recovery on, a device returns after grace_period_seconds without a new fault, a successful read,
  and no blocker NVML reports (nvml/events.py:recovery_blocker); a lost GPU's grace period starts only
  when a check reads it again. With recovery off, a GPU that comes back stays unhealthy (logged).

Touched by the monitor's thread only (and by its start() before that thread runs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.config.v1 import Health
from nvidia_device_plugin.devices import Gpu, Inventory, describe
from nvidia_device_plugin.events import HealthCause, HealthChange
from nvidia_device_plugin.health.policy import LOST, RECOVERED, stuck_cause
from nvidia_device_plugin.health.registry import HealthRegistry
from nvidia_device_plugin.nvml import events as nvml_events
from nvidia_device_plugin.nvml.api import NvmlApi
from nvidia_device_plugin.nvml.events import ProbeState

log = logging.getLogger(__name__)

# Consecutive failed liveness probes (other than GPU_IS_LOST / NOT_FOUND) after which a GPU counts as lost:
# one transient NVML_ERROR_UNKNOWN must not take a GPU out for good.
LOST_AFTER_FAILED_PROBES = 3


@dataclass(frozen=True)
class HealthScope:
    """What one health monitor watches, by which rules and clock: built once by the monitor and read by it
    and its FaultTracker, so the two never disagree on the GPUs, the policy or the time."""

    nv: NvmlApi
    inventory: Inventory
    policy: Health
    clock: Callable[[], float]
    poll_interval_s: float  # between liveness checks, and between recovery attempts of one device


@dataclass
class Fault:
    """An unhealthy device this monitor marked."""

    gpu: Gpu
    lost: bool  # the device was unreadable at the last check
    was_lost: bool  # it was unreadable at some point, so its event registration must be renewed
    last_bad_at: float  # last critical event, or last time seen lost
    next_probe_at: float = 0.0
    ecc_baseline: int | None = None  # uncorrectable ECC count when it was marked


class FaultTracker:
    """Marks devices unhealthy in `registry`, checks GPUs are readable, and brings devices back."""

    def __init__(self, scope: HealthScope, registry: HealthRegistry, failures: FailureLog) -> None:
        self._scope = scope
        self._nv = scope.nv  # these three by shorter names: read on every check
        self._inventory = scope.inventory
        self._policy = scope.policy
        self._registry = registry
        self._failures = failures  # the monitor's: what could not be checked, why recovery is refused
        self._faults: dict[str, Fault] = {}
        self._failed_probes: dict[str, int] = {}

    def adopt_unhealthy(self) -> None:
        """Take over devices a previous monitor (before a config reload) left unhealthy, so they recover."""
        now = self._scope.clock()
        for uuid in self._registry.unhealthy():
            gpu = self._inventory.gpu_of(uuid)
            if gpu is not None:
                # A GPU lost at start-up (discovery) stays lost until a liveness check reads it.
                self._faults[uuid] = Fault(gpu=gpu, lost=gpu.lost, was_lost=gpu.lost, last_bad_at=now)

    def is_lost(self, uuid: str) -> bool:
        fault = self._faults.get(uuid)
        return fault is not None and fault.lost

    def fault(self, gpu: Gpu, uuid: str, cause: HealthCause, now: float, lost: bool = False) -> None:
        """Mark `uuid` (a GPU, or a MIG device on `gpu`) unhealthy for `cause`."""
        fault = self._faults.get(uuid)
        if fault is None:
            self._faults[uuid] = Fault(
                gpu=gpu,
                lost=lost,
                was_lost=lost,
                last_bad_at=now,
                ecc_baseline=nvml_events.uncorrected_ecc(self._nv, gpu.uuid),
            )
        else:
            fault.last_bad_at = now
            fault.lost = fault.lost or lost
            fault.was_lost = fault.was_lost or lost
        if self._registry.mark(HealthChange(uuid=uuid, healthy=False, cause=cause)):
            # DEBUG: the registry's subscriber (the daemon) logs the one line, with the resources affected.
            log.debug("%s is unhealthy: %s", describe(self._inventory, uuid), cause.message)

    def mark_lost(self, gpu: Gpu, now: float, stuck_call: str | None = None) -> bool:
        """Mark `gpu` lost: unreadable, or (`stuck_call` given) waiting on an NVML call the driver never
        answered, which names the call in the reason. True when it was not lost before."""
        fault = self._faults.get(gpu.uuid)
        cause = LOST if stuck_call is None else stuck_cause(stuck_call)
        self.fault(gpu, gpu.uuid, cause, now, lost=True)
        return fault is None or not fault.lost

    def recover(self, now: float) -> bool:
        """Bring back the devices whose grace period passed and that nothing speaks against. True when
        one of them had been lost: its event registration must be renewed."""
        grace = self._policy.recovery.grace_period_seconds
        renew = False
        for uuid, fault in list(self._faults.items()):
            if fault.lost or now - fault.last_bad_at < grace or now < fault.next_probe_at:
                continue
            if self.probe(uuid, fault.gpu) != "ok":
                fault.next_probe_at = now + self._scope.poll_interval_s
                continue
            blocker = nvml_events.recovery_blocker(self._nv, fault.gpu.uuid, fault.ecc_baseline)
            if blocker is not None:
                fault.next_probe_at = now + self._scope.poll_interval_s
                where = describe(self._inventory, uuid)
                self._failures.report(f"blocker {uuid}", f"{where} stays unhealthy: {blocker}")
                continue
            del self._faults[uuid]
            self._failures.clear(f"blocker {uuid}")
            if self._registry.mark(HealthChange(uuid=uuid, healthy=True, cause=RECOVERED)):
                log.debug(
                    "%s is healthy again: no critical event for %gs, NVML reads it, and no ECC, row "
                    "remapping or recovery-action fault",
                    describe(self._inventory, uuid),
                    grace,
                )
            renew = renew or fault.was_lost
        return renew

    def check_liveness(self, now: float) -> set[str]:
        """Probe each GPU; mark the unreadable ones lost. Returns the UUIDs newly found lost."""
        newly_lost: set[str] = set()
        for gpu in self._inventory.gpus:
            fault = self._faults.get(gpu.uuid)
            result, stuck_call = self._probe(gpu.uuid, gpu)
            if result == "stuck":  # its lane waits on a call the driver never answered: out of service
                if self.mark_lost(gpu, now, stuck_call):
                    newly_lost.add(gpu.uuid)
                continue
            if result == "unknown":
                failures = self._failed_probes.get(gpu.uuid, 0) + 1
                self._failed_probes[gpu.uuid] = failures
                if failures >= LOST_AFTER_FAILED_PROBES:
                    result = "lost"
            else:
                self._failed_probes.pop(gpu.uuid, None)
            if result == "lost":
                if self.mark_lost(gpu, now):
                    newly_lost.add(gpu.uuid)
            elif result == "ok" and fault is not None and fault.lost:
                fault.lost = False
                fault.last_bad_at = now
                self._readable_again(gpu)
        return newly_lost

    def _readable_again(self, gpu: Gpu) -> None:
        if self._policy.recovery.enabled:
            after = (
                "still unhealthy; it returns to service after "
                f"{self._policy.recovery.grace_period_seconds:g}s without faults if its ECC, "
                "row remapping and recovery-action checks pass"
            )
        else:
            after = "it stays unhealthy, as health.recovery is off"
        log.info("%s is readable again; %s", gpu.label, after)

    def probe(self, uuid: str, gpu: Gpu) -> ProbeState:
        """Whether NVML can read the device now (a MIG device through its parent GPU)."""
        return self._probe(uuid, gpu)[0]

    def _probe(self, uuid: str, gpu: Gpu) -> tuple[ProbeState, str]:
        """probe(), and the stuck call when the state is "stuck" (named in the log by nvml/bounded.py)."""
        mig = self._inventory.mig_device(uuid)
        result = nvml_events.probe(self._nv, gpu.uuid, (mig.index, mig.uuid) if mig is not None else None)
        failure = result.failure
        if failure is not None and not failure.stuck:
            self._failures.report_first(
                f"probe {failure.code}", f"cannot check {describe(self._inventory, uuid)}: {failure}"
            )
        return result.state, failure.call if failure is not None else ""

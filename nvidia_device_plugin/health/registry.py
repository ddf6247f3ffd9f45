"""Which physical devices are unhealthy right now, and who wants to hear when that changes.

The registry keys health by physical UUID (a GPU UUID or a MIG UUID), never by advertised ID: replicas
share the fate of the device behind them, and a GPU takes every MIG device on it down with it. That
rule lives in one place, `health_dependencies` (the device and the GPU it sits on), applied when the
question is asked, not fanned out at mark time, so it holds for any ResourcePlan built later from the
same inventory. Everything that asks "is this advertised device usable" (the device lists kubelet sees,
Allocate, metrics) asks a `DeviceHealth`: the registry, or `UnhealthyIds` for a fixed set.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Container
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.events import CauseKind, HealthCause, HealthChange
from nvidia_device_plugin.health.policy import LOST
from nvidia_device_plugin.plans.resources import AdvertisedDevice

log = logging.getLogger(__name__)


HealthListener = Callable[[HealthChange], None]


def health_dependencies(device: AdvertisedDevice) -> tuple[str, str]:
    """The physical UUIDs whose failure takes `device` down: its own (GPU or MIG), then its GPU's."""
    return device.physical_uuid, device.gpu_uuid


@runtime_checkable
class DeviceHealth(Protocol):
    """Answers whether an advertised device is healthy now."""

    def is_healthy(self, device: AdvertisedDevice) -> bool: ...


@dataclass(frozen=True)
class UnhealthyIds:
    """A fixed DeviceHealth: devices whose advertised ID or health dependency is in `ids` are down.

    `ids` only needs to answer `in`, so a lazy view works too.
    """

    ids: Container[str]

    def is_healthy(self, device: AdvertisedDevice) -> bool:
        return device.id not in self.ids and not any(u in self.ids for u in health_dependencies(device))


@dataclass(frozen=True)
class Verdict:
    """Why a physical device is unhealthy, and since when (wall clock, UTC): what a DRA taint reads."""

    cause: HealthCause
    since: datetime


def _utc_now() -> datetime:
    return datetime.now(UTC)


class HealthRegistry:
    """Thread-safe record of unhealthy physical devices with push notification of changes.

    Listeners are called outside the state lock (so they may read the registry) but under a delivery
    lock, so they see changes in the order they were applied. A listener that raises is logged and does
    not stop delivery to the others.
    """

    def __init__(self, wall_clock: Callable[[], datetime] = _utc_now) -> None:
        self._wall_clock = wall_clock
        self._state_lock = threading.Lock()
        # Re-entrant so a listener may itself call mark() on the delivering thread.
        self._delivery_lock = threading.RLock()
        self._unhealthy: dict[str, Verdict] = {}
        self._listeners: list[HealthListener] = []

    def mark(self, change: HealthChange) -> bool:
        """Apply `change`; True (and listeners notified) only when healthy/unhealthy actually flipped.

        A device that is already unhealthy keeps the cause that first took it down: later XIDs on a
        broken GPU are usually consequences, and the first cause is what an operator needs.
        """
        with self._delivery_lock:
            with self._state_lock:
                was_unhealthy = change.uuid in self._unhealthy
                if change.healthy:
                    if not was_unhealthy:
                        return False
                    del self._unhealthy[change.uuid]
                else:
                    if was_unhealthy:
                        return False
                    self._unhealthy[change.uuid] = Verdict(change.cause, self._wall_clock())
                listeners = tuple(self._listeners)
            for listener in listeners:
                try:
                    listener(change)
                except Exception:
                    log.exception("health listener %r failed on %s", listener, change)
        return True

    def unhealthy(self) -> dict[str, str]:
        """Physical UUID (GPU or MIG) -> reason (its cause's message), as a copy."""
        with self._state_lock:
            return {uuid: verdict.cause.message for uuid, verdict in self._unhealthy.items()}

    def verdicts(self) -> dict[str, Verdict]:
        """Physical UUID (GPU or MIG) -> its typed cause and since when, as a copy."""
        with self._state_lock:
            return dict(self._unhealthy)

    def is_healthy(self, device: AdvertisedDevice) -> bool:
        return self.reason(device) is None

    def reason(self, device: AdvertisedDevice) -> str | None:
        """Why `device` is unhealthy (its GPU's reason first, as that is the wider failure), else None."""
        with self._state_lock:
            for uuid in reversed(health_dependencies(device)):
                verdict = self._unhealthy.get(uuid)
                if verdict is not None:
                    return verdict.cause.message
        return None

    def subscribe(self, listener: HealthListener) -> Callable[[], None]:
        """Call `listener` on every change from now on; returns a function that unsubscribes (idempotent)."""
        with self._state_lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._state_lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe


REASON_LOST_AT_START_UP = "GPU lost at start-up"
LOST_AT_START_UP = HealthCause(CauseKind.LOST_AT_START_UP, REASON_LOST_AT_START_UP)
REDISCOVERED = HealthCause(CauseKind.REDISCOVERED, "re-discovered: read whole again")


def mark_lost_at_start_up(registry: HealthRegistry, inventory: Inventory) -> None:
    """Mark the GPUs discovery found lost (GPU_IS_LOST, or a call stuck) unhealthy, before they are served;
    the health monitor adopts them and keeps probing them."""
    for gpu in inventory.gpus:
        if gpu.lost:
            registry.mark(HealthChange(uuid=gpu.uuid, healthy=False, cause=LOST_AT_START_UP))


def mark_lost_on_reload(registry: HealthRegistry, inventory: Inventory) -> None:
    """On a reload, before the new snapshot is served: the GPUs discovery found lost now (as lost: this
    is no start-up), so that no server of the new snapshot shows one Healthy for a moment."""
    for gpu in inventory.gpus:
        if gpu.lost:
            registry.mark(HealthChange(uuid=gpu.uuid, healthy=False, cause=LOST))


def bring_back_rediscovered(registry: HealthRegistry, inventory: Inventory) -> None:
    """On a reload, once the new snapshot is served: the GPUs lost at start-up that discovery read whole
    this time turn Healthy.

    A GPU that was unreadable when the plugin started has served nothing yet, and a plugin restart would
    serve it Healthy once it reads: a reload that reads it whole does the same, health.recovery or not.
    A GPU lost while it was served stays under the health monitor's rules. Only after serving: marked
    earlier, kubelet saw the GPU Healthy while the old snapshot (which knew none of its facts, its memory
    for the MPS limits among them) still answered Allocate.
    """
    verdicts = registry.verdicts()
    for gpu in inventory.gpus:
        verdict = verdicts.get(gpu.uuid)
        if not gpu.lost and verdict is not None and verdict.cause.kind is CauseKind.LOST_AT_START_UP:
            registry.mark(HealthChange(uuid=gpu.uuid, healthy=True, cause=REDISCOVERED))

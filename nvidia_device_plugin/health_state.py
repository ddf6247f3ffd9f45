"""Which physical devices are unhealthy right now, and who wants to hear when that changes.

The registry keys health by physical UUID (a GPU UUID or a MIG UUID), never by advertised ID: replicas
share the fate of the device behind them, and a GPU takes every MIG device on it down with it. The
propagation rule therefore lives in `is_healthy` (look at the device and at the GPU it sits on), not in
fan-out at mark time, so it holds for any ResourcePlan built later from the same inventory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from nvidia_device_plugin.events import HealthChange
from nvidia_device_plugin.resources import AdvertisedDevice

log = logging.getLogger(__name__)


HealthListener = Callable[[HealthChange], None]


class HealthRegistry:
    """Thread-safe record of unhealthy physical devices with push notification of changes.

    Listeners are called outside the state lock (so they may read the registry) but under a delivery
    lock, so they see changes in the order they were applied. A listener that raises is logged and does
    not stop delivery to the others.
    """

    def __init__(self) -> None:
        self._state_lock = threading.Lock()
        # Re-entrant so a listener may itself call mark() on the delivering thread.
        self._delivery_lock = threading.RLock()
        self._unhealthy: dict[str, str] = {}
        self._listeners: list[HealthListener] = []

    def mark(self, change: HealthChange) -> bool:
        """Apply `change`; True (and listeners notified) only when healthy/unhealthy actually flipped.

        A device that is already unhealthy keeps the reason that first took it down: later XIDs on a
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
                    self._unhealthy[change.uuid] = change.reason
                listeners = tuple(self._listeners)
            for listener in listeners:
                try:
                    listener(change)
                except Exception:
                    log.exception("health listener %r failed on %s", listener, change)
        return True

    def unhealthy(self) -> dict[str, str]:
        """Physical UUID (GPU or MIG) -> reason, as a copy."""
        with self._state_lock:
            return dict(self._unhealthy)

    def is_healthy(self, device: AdvertisedDevice) -> bool:
        with self._state_lock:
            return device.physical_uuid not in self._unhealthy and device.gpu_uuid not in self._unhealthy

    def reason(self, device: AdvertisedDevice) -> str | None:
        """Why `device` is unhealthy (its GPU's reason first, as that is the wider failure), else None."""
        with self._state_lock:
            gpu_reason = self._unhealthy.get(device.gpu_uuid)
            return gpu_reason if gpu_reason is not None else self._unhealthy.get(device.physical_uuid)

    def subscribe(self, listener: HealthListener) -> Callable[[], None]:
        """Call `listener` on every change from now on; returns a function that unsubscribes (idempotent)."""
        with self._state_lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._state_lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

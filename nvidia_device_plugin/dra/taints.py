"""Device taints from health: the XID monitor's verdicts, as DRA taints on the devices they take down.

The health registry (health/registry.py) is the one place that decides who is unhealthy; this module
only says how a verdict reads on a DRA device, and keeps the verdicts with what a taint needs and the
registry does not keep (the XID, when the taint appeared):

* a critical XID: `gpu.nvidia.com/xid=<n>`, NoSchedule;
* a lost GPU (GPU_IS_LOST, or lost at start-up): `gpu.nvidia.com/gpu-lost`, NoSchedule;
* anything else (a double-bit ECC error without an XID): `gpu.nvidia.com/unhealthy`, NoSchedule.

NoSchedule keeps new claims off the device and leaves running pods alone, as the device plugin's
Unhealthy does; a taint goes when the device recovers under the existing rules (health.recovery). A
GPU's taint applies to its MIG devices too (health_dependencies: a GPU takes its MIG devices down).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from datetime import UTC, datetime

from nvidia_device_plugin.dra.names import DRIVER_NAME, DraDevice
from nvidia_device_plugin.events import HealthChange
from nvidia_device_plugin.health.policy import REASON_DOUBLE_BIT_ECC, REASON_LOST
from nvidia_device_plugin.health.registry import REASON_LOST_AT_START_UP

XID_TAINT = f"{DRIVER_NAME}/xid"
LOST_TAINT = f"{DRIVER_NAME}/gpu-lost"
UNHEALTHY_TAINT = f"{DRIVER_NAME}/unhealthy"
_XID_REASON = re.compile(r"^XID (\d+)\b")


@dataclass(frozen=True)
class Taint:
    key: str
    value: str | None
    time_added: str | None = None  # RFC 3339; None in dry runs (`dra plan`)

    def to_json(self) -> dict[str, str]:
        out = {"key": self.key, "effect": "NoSchedule"}
        if self.value is not None:
            out["value"] = self.value
        if self.time_added is not None:
            out["timeAdded"] = self.time_added
        return out


def taint_for(reason: str, xid: int | None) -> tuple[str, str | None]:
    """(key, value) of the taint a health verdict gives."""
    if xid is None and (match := _XID_REASON.match(reason)) is not None:
        xid = int(match[1])  # a verdict seeded from the registry, which keeps only the reason
    if xid is not None:
        return XID_TAINT, str(xid)
    if reason in (REASON_LOST, REASON_LOST_AT_START_UP):
        return LOST_TAINT, None
    return UNHEALTHY_TAINT, "double-bit-ecc" if reason == REASON_DOUBLE_BIT_ECC else None


class TaintBook:
    """The current taint of each unhealthy physical device (GPU or MIG UUID); thread-safe."""

    def __init__(self, unhealthy: dict[str, str] | None = None) -> None:
        self._lock = threading.Lock()
        self._taints: dict[str, Taint] = {}
        for uuid, reason in (unhealthy or {}).items():
            self._taints[uuid] = Taint(*taint_for(reason, None), _now())

    def apply(self, change: HealthChange) -> bool:
        """Record `change`; True when a device's taint appeared or went."""
        with self._lock:
            if change.healthy:
                return self._taints.pop(change.uuid, None) is not None
            if change.uuid in self._taints:
                return False  # the first cause stays, as the registry keeps the first reason
            self._taints[change.uuid] = Taint(*taint_for(change.reason, change.xid), _now())
            return True

    def taints(self, device: DraDevice) -> list[Taint]:
        """The taints of `device`: its GPU's, then its own (a MIG device's), each key once."""
        with self._lock:
            found = [self._taints.get(device.gpu.uuid), self._taints.get(device.uuid)]
        unique: dict[str, Taint] = {}
        for taint in found:
            if taint is not None:
                unique.setdefault(taint.key, taint)
        return list(unique.values())


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

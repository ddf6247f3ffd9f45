"""Device taints from health: the health registry's verdicts, as DRA taints on the devices they take down.

The health registry (health/registry.py) is the one place that decides who is unhealthy, and keeps each
verdict's typed cause and since when; a device's taints are a function of the device and those verdicts
(as NVIDIA's DRA driver derives a taint from a health event, healthEventToTaint), kept nowhere else:

* a critical XID: `gpu.nvidia.com/xid=<n>`, NoSchedule;
* a lost GPU (GPU_IS_LOST, or lost at start-up): `gpu.nvidia.com/gpu-lost`, NoSchedule;
* anything else (a double-bit ECC error without an XID, a stuck NVML call): `gpu.nvidia.com/unhealthy`,
  NoSchedule (value `double-bit-ecc` for the former).

NoSchedule keeps new claims off the device and leaves running pods alone, as the device plugin's
Unhealthy does; a taint goes when the device recovers under the existing rules (health.recovery). A
GPU's taint applies to its MIG devices too (health_dependencies: a GPU takes its MIG devices down).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from nvidia_device_plugin.dra.names import DRIVER_NAME, DraDevice
from nvidia_device_plugin.events import CauseKind, HealthCause
from nvidia_device_plugin.health.registry import Verdict

XID_TAINT = f"{DRIVER_NAME}/xid"
LOST_TAINT = f"{DRIVER_NAME}/gpu-lost"
UNHEALTHY_TAINT = f"{DRIVER_NAME}/unhealthy"
_LOST_KINDS = frozenset({CauseKind.LOST, CauseKind.LOST_AT_START_UP})


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


def taint_for(cause: HealthCause) -> tuple[str, str | None]:
    """(key, value) of the taint a health cause gives."""
    if cause.kind is CauseKind.XID and cause.xid is not None:
        return XID_TAINT, str(cause.xid)
    if cause.kind in _LOST_KINDS:
        return LOST_TAINT, None
    return UNHEALTHY_TAINT, "double-bit-ecc" if cause.kind is CauseKind.DOUBLE_BIT_ECC else None


def device_taints(device: DraDevice, verdicts: Mapping[str, Verdict]) -> list[Taint]:
    """The taints of `device` under `verdicts` (physical UUID -> verdict): its GPU's, then its own (a MIG
    device's), each key once."""
    unique: dict[str, Taint] = {}
    for uuid in (device.gpu.uuid, device.uuid):
        verdict = verdicts.get(uuid)
        if verdict is not None:
            key, value = taint_for(verdict.cause)
            unique.setdefault(key, Taint(key, value, _rfc3339(verdict.since)))
    return list(unique.values())


class HealthTaints:
    """The taints of DRA devices, read from the health registry's verdicts each time they are asked."""

    def __init__(self, verdicts: Callable[[], Mapping[str, Verdict]]) -> None:
        self._verdicts = verdicts

    def taints(self, device: DraDevice) -> list[Taint]:
        return device_taints(device, self._verdicts())


def _rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")

"""The health of each DRA device as kubelet's health stream reports it, from the health registry's verdicts.

The health registry (health/registry.py) is the one place that decides who is unhealthy, and keeps each
verdict's typed cause and since when; a device's reported health is a function of the device and those
verdicts, as its taints are (dra/taints.py), and the two always agree: a device is UNHEALTHY exactly when
it has a taint, with its cause's message (the GPU's first, as the wider failure: a GPU takes its MIG
devices down). With health checks off (`health.disabled`) nothing watches the devices: UNKNOWN, never a
HEALTHY that nothing checked.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from nvidia_device_plugin.dra.names import DraDevice
from nvidia_device_plugin.health.registry import Verdict

CHECKS_DISABLED = "health checks are disabled (health.disabled)"


class HealthStatus(enum.Enum):
    """kubelet's three states (dra-health HealthStatus)."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class DeviceHealthReport:
    """One device's health: pool and device name as published, the status, why (empty when healthy)."""

    pool: str
    device: str
    status: HealthStatus
    message: str = ""
    since: datetime | None = None  # when the verdict was reached (UNHEALTHY only)


def device_health(
    devices: Mapping[str, DraDevice],
    verdicts: Mapping[str, Verdict],
    pool: str,
    checks_disabled: bool = False,
) -> tuple[DeviceHealthReport, ...]:
    """The health of every device of `devices` (by name, in name order) in `pool`, under `verdicts`
    (physical UUID -> verdict)."""
    reports = []
    for name in sorted(devices):
        device = devices[name]
        verdict = verdicts.get(device.gpu.uuid) or verdicts.get(device.uuid)
        if verdict is not None:
            report = DeviceHealthReport(
                pool, name, HealthStatus.UNHEALTHY, verdict.cause.message, verdict.since
            )
        elif checks_disabled:
            report = DeviceHealthReport(pool, name, HealthStatus.UNKNOWN, CHECKS_DISABLED)
        else:
            report = DeviceHealthReport(pool, name, HealthStatus.HEALTHY)
        reports.append(report)
    return tuple(reports)

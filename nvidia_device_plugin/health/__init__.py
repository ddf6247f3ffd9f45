"""Device health: XID policy, the NVML monitor thread, and the registry of unhealthy devices."""

from nvidia_device_plugin.health.monitor import HealthMonitor
from nvidia_device_plugin.health.policy import REASON_DOUBLE_BIT_ECC, REASON_LOST, attribute_xid, xid_reason
from nvidia_device_plugin.health.registry import (
    DeviceHealth,
    HealthListener,
    HealthRegistry,
    UnhealthyIds,
    health_dependencies,
)

__all__ = [
    "REASON_DOUBLE_BIT_ECC",
    "REASON_LOST",
    "DeviceHealth",
    "HealthListener",
    "HealthMonitor",
    "HealthRegistry",
    "UnhealthyIds",
    "attribute_xid",
    "health_dependencies",
    "xid_reason",
]

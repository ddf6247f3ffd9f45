"""What an XID means for health: reasons, names, and which devices it takes down.

Decisions where NVIDIA's plugin (internal/rm/health.go) differs or is silent:

* Which XIDs are critical is health.criticalXIDs / ignoredXIDs (config.v1.Health.is_critical); this
  module only names them and attributes them.
* MIG attribution: an XID whose gpuInstanceId and computeInstanceId name one MIG device marks that MIG
  device; one with only a known gpuInstanceId marks the MIG devices of that GPU instance (they share
  its memory and SMs); anything else, including IDs matching no MIG device, marks the whole GPU.
  Double-bit ECC errors always mark the whole GPU.
"""

from __future__ import annotations

from nvidia_device_plugin.devices import Gpu
from nvidia_device_plugin.events import CauseKind, HealthCause

REASON_LOST = "GPU lost"
REASON_DOUBLE_BIT_ECC = "double-bit ECC error"
LOST = HealthCause(CauseKind.LOST, REASON_LOST)
DOUBLE_BIT_ECC = HealthCause(CauseKind.DOUBLE_BIT_ECC, REASON_DOUBLE_BIT_ECC)
RECOVERED = HealthCause(CauseKind.RECOVERED, "recovered")


def stuck_reason(call: str) -> str:
    """The reason recorded for a GPU whose NVML call `call` did not return (nvml/bounded.py)."""
    return f"NVML call {call} stuck" if call else "NVML call stuck"


def stuck_cause(call: str) -> HealthCause:
    """The cause recorded for a GPU whose NVML call `call` did not return (nvml/bounded.py)."""
    return HealthCause(CauseKind.NVML_STUCK, stuck_reason(call))


# Names of XIDs an operator is likely to meet, from NVIDIA's XID catalogue, for log lines only.
_XID_NAMES = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    68: "video processor exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def known_xid(xid: int) -> bool:
    """Whether `xid` is one this plugin names (the catalogue above): metrics label only those by number."""
    return xid in _XID_NAMES


def xid_reason(xid: int) -> str:
    """The reason string recorded for a critical XID, e.g. "XID 79 (GPU has fallen off the bus)"."""
    name = _XID_NAMES.get(xid)
    return f"XID {xid} ({name})" if name else f"XID {xid}"


def xid_cause(xid: int) -> HealthCause:
    """The cause recorded for a critical XID: its number, and xid_reason's words."""
    return HealthCause(CauseKind.XID, xid_reason(xid), xid)


def attribute_xid(gpu: Gpu, gpu_instance_id: int | None, compute_instance_id: int | None) -> list[str]:
    """UUIDs an XID on `gpu` with these instance IDs (None: not attributed) makes unhealthy."""
    if not gpu.mig_devices or gpu_instance_id is None:
        return [gpu.uuid]
    in_instance = [m for m in gpu.mig_devices if m.gpu_instance_id == gpu_instance_id]
    if compute_instance_id is not None:
        in_instance = [m for m in in_instance if m.compute_instance_id == compute_instance_id]
    return [m.uuid for m in in_instance] or [gpu.uuid]

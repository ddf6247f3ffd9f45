"""The one typed interface by which things that happen reach metrics (and anything else that counts them).

Every producer (gRPC servers, the registrar, the health monitor, the daemon's reload) is handed one
`Events` object and calls its methods; the default implementation does nothing, so a producer never
checks for a missing listener. Methods are called on gRPC, registrar, health and watcher threads: an
implementation must be thread-safe, must not block, and must not raise (a raise is the producer's bug
report, not a way to veto anything).

`Events` extends the plugin framework's own `PluginEvents` (plugin/events.py: a call answered, registered,
kubelet restarted) with what the GPU side reports, so the framework is handed it without knowing the rest.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from nvidia_device_plugin.plugin.events import CallError as CallError
from nvidia_device_plugin.plugin.events import CallMethod as CallMethod
from nvidia_device_plugin.plugin.events import PluginEvents


class CauseKind(enum.Enum):
    """Why a physical device went down or came back: what a DRA taint, a metric or a log line branches on."""

    XID = "xid"  # a critical XID (HealthCause.xid says which)
    DOUBLE_BIT_ECC = "double-bit-ecc"  # an uncorrectable ECC error NVML reported without an XID
    LOST = "lost"  # GPU_IS_LOST, not found, or unreadable probe after probe while served
    LOST_AT_START_UP = "lost-at-start-up"  # discovery could not read it: it has served nothing yet
    NVML_STUCK = "nvml-stuck"  # an NVML call on it never returned (nvml/bounded.py)
    RECOVERED = "recovered"  # health.recovery brought it back
    REDISCOVERED = "rediscovered"  # lost at start-up, read whole by a reload's discovery


@dataclass(frozen=True)
class HealthCause:
    """Why a device's health changed, typed: decided where the fault is seen, never parsed back."""

    kind: CauseKind
    message: str  # operator-readable, e.g. "XID 79 (GPU has fallen off the bus)" or "GPU lost"
    xid: int | None = None  # the XID, for kind XID


@dataclass(frozen=True)
class HealthChange:
    """A physical device (GPU or MIG UUID) became healthy or unhealthy, and why."""

    uuid: str
    healthy: bool
    cause: HealthCause

    @property
    def reason(self) -> str:
        return self.cause.message

    @property
    def xid(self) -> int | None:
        return self.cause.xid


class Events(PluginEvents):
    """Receives what happens in the daemon. This base class ignores everything; override what you count.

    call_answered, registered and kubelet_restarted come from PluginEvents (the plugin framework's).
    """

    def config_reloaded(self, applied: bool, error: str) -> None:
        """A config reload was applied, or rejected with `error` (the previous config keeps serving)."""

    def xid_seen(self, gpu_uuid: str, xid: int, critical: bool) -> None:
        """NVML reported an XID on a GPU; critical when the health policy takes devices down for it."""

    def health_changed(self, change: HealthChange) -> None:
        """A physical device flipped between healthy and unhealthy."""

    def mps_readiness_changed(self, gpu_uuid: str, ready: bool) -> None:
        """The MPS control daemon of a GPU became ready or not ready (also its first reading)."""

    def mig_strategy_violation(self, gpu_uuid: str, strategy: str) -> None:
        """A snapshot left GPU `gpu_uuid` out because it breaks flags.migStrategy `strategy`."""

    def nvml_call_stuck(self, call: str, stuck: bool) -> None:
        """An NVML call passed its deadline (stuck), or such a call returned at last (nvml/bounded.py)."""

    def nvml_call_slow(self, call: str, where: str, seconds: float) -> None:
        """An NVML call on `where` ("GPU 3") returned, but took a quarter of its deadline or more."""


NO_EVENTS = Events()

"""What the plugin framework reports as it serves: the three events it raises, as a Protocol of its own.

The framework knows nothing about GPUs, XIDs or MPS: it calls only these. The application hands it an
object that has them (the daemon's metrics, through `events.Events`, which extends this Protocol); the
default hears nothing, so the framework never checks for a missing listener. Methods are called on gRPC
and registrar threads: an implementation must be thread-safe, must not block and must not raise.
"""

from __future__ import annotations

from typing import Literal, Protocol

CallMethod = Literal["Allocate", "GetPreferredAllocation"]  # the unary kubelet calls that are counted
CallError = Literal["invalid_argument", "internal"]


class PluginEvents(Protocol):
    """The framework's events. The bodies do nothing: a class that extends this overrides what it counts."""

    def call_answered(
        self,
        resource: str,
        method: CallMethod,
        seconds: float,
        error: CallError | None,
    ) -> None:
        """A unary kubelet call on `resource` finished (error None: answered successfully)."""
        return None

    def registered(self, resource: str) -> None:
        """`resource` was registered with kubelet (at start, after a kubelet restart, or a rebind)."""
        return None

    def kubelet_restarted(self) -> None:
        """Kubelet re-created its registration socket."""
        return None


class _Unheard(PluginEvents):
    """Hears nothing: the framework's default listener."""


NO_PLUGIN_EVENTS: PluginEvents = _Unheard()

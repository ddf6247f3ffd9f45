"""A sharing mode (none, time-slicing, MPS) as one frozen value that answers what the plugin asks of it.

The config and the plans spell a mode as a string (`Sharing.strategy`, `ResourcePlan.sharing`, the
`v1.SharingMode` Literal), which is also what labels, plan tables and DRA attributes show. What a mode
means (replicas, a control daemon, one GPU per request, the DRA class) is said here once, so the daemon,
Allocate, metrics, announcements, labels and DRA ask `sharing_mode(name)` instead of comparing strings.
It lives in config/ because every area that meets a mode may import config/ (plans/ ranks below
sharing/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.v1 import SHARING_MODES, SharingMode

# An MPS server takes at most 48 client processes per GPU (Volta and newer), so more replicas would
# advertise devices whose pods cannot connect.
MPS_MAX_CLIENTS_PER_GPU = 48


@dataclass(frozen=True)
class SharingModeFacts:
    """What one sharing mode means to each part of the plugin."""

    name: SharingMode  # as the config and the plans spell it
    section: str  # the config section that lists its resources; "" for none, which lists none
    shares_devices: bool  # its devices are advertised as replicas, `<uuid>::<n>`
    needs_control_daemon: bool  # replicas are healthy only while their GPU's MPS control daemon is ready
    one_gpu_per_request: bool  # a container's replicas come from one GPU (it has one MPS pipe per resource)
    shares_mig_devices: bool  # MIG devices may be shared this way (NVIDIA refuses MPS on MIG)
    replicas_at_most: int | None  # per device, where the mode itself has a bound
    dra_class: bool  # DRA gets a DeviceClass for its resources (serving them by extendedResourceName)
    dra_shareable: bool  # DRA publishes its devices once, shareable, with a `shares` capacity
    # The DRA `sharing` attribute of its devices. An MPS GPU's claims are clients of the control daemon
    # mps-control-daemon runs for the config (dra/kubelet/claim_sharing.config_mps_edits), as replicas are.
    dra_attribute: SharingMode


NO_SHARING: Final = SharingModeFacts(
    name="none",
    section="",
    shares_devices=False,
    needs_control_daemon=False,
    one_gpu_per_request=False,
    shares_mig_devices=True,
    replicas_at_most=None,
    dra_class=True,
    dra_shareable=False,
    dra_attribute="none",
)
TIME_SLICING: Final = SharingModeFacts(
    name="time-slicing",
    section="sharing.timeSlicing",
    shares_devices=True,
    needs_control_daemon=False,
    one_gpu_per_request=False,
    shares_mig_devices=True,
    replicas_at_most=None,
    dra_class=True,
    dra_shareable=True,
    dra_attribute="time-slicing",
)
MPS: Final = SharingModeFacts(
    name="mps",
    section="sharing.mps",
    shares_devices=True,
    needs_control_daemon=True,
    one_gpu_per_request=True,
    shares_mig_devices=False,
    replicas_at_most=MPS_MAX_CLIENTS_PER_GPU,
    dra_class=True,
    dra_shareable=True,
    dra_attribute="mps",
)

_BY_NAME: Final[dict[str, SharingModeFacts]] = {mode.name: mode for mode in (NO_SHARING, TIME_SLICING, MPS)}


def sharing_mode(name: SharingMode) -> SharingModeFacts:
    """The mode `name` spells ("none", "time-slicing", "mps"); ConfigError for any other string."""
    mode = _BY_NAME.get(name)
    if mode is None:
        raise ConfigError(f"sharing mode {name!r} is not one of {', '.join(SHARING_MODES)}")
    return mode

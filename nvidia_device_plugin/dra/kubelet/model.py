"""The values the kubelet DRA plugin's modules pass between them, and its errors.

A claim reference is what kubelet sends (namespace, name, UID); a prepared device is what it gets back for
one allocation result (the claim's request names, the pool and device, the CDI names). `NodeDevices` is
what the plugin needs to know about the node at the moment of a prepare: which DRA device names exist and
what stands behind them (from the snapshot, fed by the daemon), and where the driver's files and device
nodes are (for the CDI spec).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nvidia_device_plugin.base.errors import DevicePluginError
from nvidia_device_plugin.cdi.model import CdiSettings
from nvidia_device_plugin.config.sharing_modes import SharingModeFacts
from nvidia_device_plugin.config.v1 import SharingMode
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.dra.names import DraDevice
from nvidia_device_plugin.nvml.host import HostPaths


class DraError(DevicePluginError):
    """The DRA kubelet plugin cannot do something; the message names what and why."""


class ClaimError(DraError):
    """One claim cannot be prepared (or unprepared): answered in that claim's entry of the response, so the
    other claims of the call are still served and kubelet retries this one."""


@dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim as kubelet names it in NodePrepareResources / NodeUnprepareResources."""

    namespace: str
    name: str
    uid: str

    @property
    def label(self) -> str:
        """How messages name the claim: "claim default/gpu-claim (UID 0f3c...)"."""
        return f"claim {self.namespace}/{self.name} (UID {self.uid})"


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated device of a prepared claim, as the response's Device message carries it."""

    requests: tuple[str, ...]  # the claim's request names (subrequest names stripped: "r/a100" -> "r")
    pool: str
    device: str  # the DRA device name, "gpu-3" or "gpu-3-mig-9-4-2"
    cdi_ids: tuple[str, ...]  # fully qualified CDI names: "k8s.gpu.nvidia.com/claim=<claim UID>-<device>"


@dataclass(frozen=True)
class ClaimOutcome:
    """What one claim of a NodePrepareResources call gets: its devices, or why it was refused."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class ConfigSharing:
    """How the node's config shares one GPU through a device-plugin resource (`sharing.timeSlicing` or
    `sharing.mps`), outside DRA: an MPS one has the mps-control-daemon's control daemon on it."""

    mode: SharingModeFacts
    resource: str  # the resource whose replicas share it, "nvidia.com/gpu"
    replicas: int = 1  # the replicas the config makes of it
    memory_bytes: int = 0  # its memory (0: not known), which MPS divides among the replicas


@dataclass(frozen=True)
class NodeDevices:
    """The node as a prepare sees it: the DRA devices by name, and the facts its CDI spec needs.

    `devices` holds exactly the names this node publishes in its ResourceSlices (dra/names.py makes them);
    a claim naming any other device is refused. `inventory`, `host` and `cdi` are the snapshot's inventory,
    the NVML session's host paths (the driver root and /dev as this process sees them) and the CDI settings
    of the config (`CdiSettings.from_config`: host driver root, hook path, disabled hooks; its device-ID
    strategy and spec directory are not used here). `config_sharing` says which GPUs (by UUID) the config's
    own sharing covers (claim_sharing.config_sharing_of), so a claim's sharing never lands under it.
    """

    devices: Mapping[str, DraDevice]
    inventory: Inventory
    host: HostPaths
    cdi: CdiSettings
    config_sharing: Mapping[str, ConfigSharing] = field(default_factory=dict)


@dataclass(frozen=True)
class PreparedSharing:
    """What a prepare set up on one physical GPU for a claim's opaque config: kept in the checkpoint, so
    another claim asking the GPU for different sharing is refused and a restart finds the claim's MPS
    control daemon instead of starting a second one."""

    gpu_uuid: str
    mode: SharingMode  # "time-slicing" or "mps" (config/sharing_modes.py says what each means)
    interval: str | None = None  # time-slicing of a whole GPU: Default, Short, Medium, Long
    active_thread_percentage: int | None = None  # MPS: the client default, None: the daemon's own
    pinned_memory_limit_mib: int | None = None  # MPS: the client default, None: none

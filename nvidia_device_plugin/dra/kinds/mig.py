"""A static MIG device as a DRA device, as NVIDIA's DRA driver publishes it (kubernetes-sigs/
dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin: `MigSpecTuple.ToCanonicalName`, `MigDeviceInfo.GetDevice`):
named `gpu-<parent minor>-mig-<profile without dots>-<GI profile ID>-<placement start>` (e.g.
`gpu-0-mig-1g10gb-19-0`: its physical configuration, stable across restarts), type=mig, its UUID,
parentUUID and profile, and the capacities multiprocessors, copyEngines, decoders, encoders, jpegEngines,
ofaEngines, memory and one `memorySlice<N>: 1` per memory slice it occupies; selected by the
`mig.nvidia.com` DeviceClass. A MIG device NVML would not give a profile ID or placement for, or whose name
would not be a DNS label, has no name and is not published."""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvidia_device_plugin.devices import Gpu, MigDevice
from nvidia_device_plugin.dra.kinds import DraDevice, Json
from nvidia_device_plugin.dra.values import quantity
from nvidia_device_plugin.plans.resources import AdvertisedDevice, mig_device

MIG_CLASS = "mig.nvidia.com"
# A DRA device name is a DNS label (RFC 1123): lower-case alphanumerics and '-', at most 63 characters.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NOT_IN_LABEL = re.compile(r"[^a-z0-9-]")


def _profile_token(profile: str) -> str:
    """The profile as NVIDIA's driver writes it in a name: dots dropped, anything else not allowed in a
    DNS label made '-' ("1g.10gb" -> "1g10gb", "1g.10gb+me" -> "1g10gb-me")."""
    return _NOT_IN_LABEL.sub("-", profile.replace(".", "").lower()).strip("-")


def mig_device_name(parent: Gpu, profile: str, profile_id: int, placement_start: int) -> str:
    return f"gpu-{parent.minor}-mig-{_profile_token(profile)}-{profile_id}-{placement_start}"


def mig_name_of(parent: Gpu, mig: MigDevice) -> str | None:
    """`mig`'s DRA name; None where NVML would not give its profile ID or placement, or the name would not be
    a DNS label (it is then not published)."""
    if mig.gi_profile_info_id is None or mig.placement is None:
        return None
    name = mig_device_name(parent, mig.profile, mig.gi_profile_info_id, mig.placement[0])
    return name if _DNS_LABEL.fullmatch(name) else None


@dataclass(frozen=True)
class StaticMig:
    name: str = "mig"
    device_class: str = MIG_CLASS

    def devices(self, gpu: Gpu) -> list[DraDevice]:
        if not gpu.mig_enabled:
            return []
        named = ((mig_name_of(gpu, mig), mig) for mig in gpu.mig_devices)
        return [DraDevice(name, gpu, mig, self) for name, mig in named if name is not None]

    def uuid(self, device: DraDevice) -> str:
        return _mig(device).uuid

    def attributes(self, device: DraDevice) -> Json:
        mig = _mig(device)
        return {
            "type": {"string": self.name},
            "uuid": {"string": mig.uuid},
            "parentUUID": {"string": device.gpu.uuid},
            "profile": {"string": mig.profile},
        }

    def capacity(self, device: DraDevice) -> Json:
        mig = _mig(device)
        capacity: Json = {}
        attrs = mig.attributes
        if attrs is not None:
            for name, value in (
                ("multiprocessors", attrs.multiprocessors),
                ("copyEngines", attrs.copy_engines),
                ("decoders", attrs.decoders),
                ("encoders", attrs.encoders),
                ("jpegEngines", attrs.jpeg_decoders),
                ("ofaEngines", attrs.ofa_engines),
            ):
                capacity[name] = {"value": str(value)}
        capacity["memory"] = {"value": quantity(mig.memory_bytes)}
        if mig.placement is not None:  # always, for a published device (mig_name_of)
            start, size = mig.placement
            for memory_slice in range(start, start + size):
                capacity[f"memorySlice{memory_slice}"] = {"value": "1"}
        return capacity

    def advertised(self, device: DraDevice) -> AdvertisedDevice:
        return mig_device(device.gpu, _mig(device))


def _mig(device: DraDevice) -> MigDevice:
    if device.mig is None:  # a bug: only this kind makes its devices, each with its MIG device
        raise ValueError(f"DRA device {device.name} is of kind mig but has no MIG device")
    return device.mig


MIG = StaticMig()

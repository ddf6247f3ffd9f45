"""A static MIG device as a DRA device: `gpu-<parent minor>-mig-<GI profile ID>-<placement start>-
<placement size>` (its physical configuration, stable across restarts), type=mig, its UUID, parentUUID and
profile, and the capacities multiprocessors, copyEngines, decoders, encoders, jpegEngines, ofaEngines and
memory; selected by the `mig.nvidia.com` DeviceClass. A MIG device NVML would not give a profile ID or
placement for has no name and is not published."""

from __future__ import annotations

from dataclasses import dataclass

from nvidia_device_plugin.devices import Gpu, MigDevice
from nvidia_device_plugin.dra.kinds import DraDevice, Json
from nvidia_device_plugin.dra.values import quantity
from nvidia_device_plugin.plans.resources import AdvertisedDevice, mig_device

MIG_CLASS = "mig.nvidia.com"


def mig_device_name(parent: Gpu, profile_id: int, placement_start: int, placement_size: int) -> str:
    return f"gpu-{parent.minor}-mig-{profile_id}-{placement_start}-{placement_size}"


def mig_name_of(parent: Gpu, mig: MigDevice) -> str | None:
    """`mig`'s DRA name; None where NVML would not give its profile ID or placement (it is not published)."""
    if mig.gi_profile_info_id is None or mig.placement is None:
        return None
    return mig_device_name(parent, mig.gi_profile_info_id, *mig.placement)


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
        return capacity

    def advertised(self, device: DraDevice) -> AdvertisedDevice:
        return mig_device(device.gpu, _mig(device))


def _mig(device: DraDevice) -> MigDevice:
    if device.mig is None:  # a bug: only this kind makes its devices, each with its MIG device
        raise ValueError(f"DRA device {device.name} is of kind mig but has no MIG device")
    return device.mig


MIG = StaticMig()

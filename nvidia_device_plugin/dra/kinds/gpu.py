"""A whole GPU as a DRA device: `gpu-<minor>` (the minor of /dev/nvidia<minor>, which does not shift when
another GPU drops, unlike the index), type=gpu, its UUID, a `memory` capacity; selected by the
`gpu.nvidia.com` DeviceClass. A GPU in MIG mode is not one (it runs no CUDA work): its MIG devices are;
but one in MIG mode without MIG devices is published whole (with dynamic MIG off), as the device plugin
advertises it under migStrategy none: otherwise the node would publish nothing for it at all."""

from __future__ import annotations

from dataclasses import dataclass

from nvidia_device_plugin.devices import Gpu
from nvidia_device_plugin.dra.kinds import DraDevice, Json
from nvidia_device_plugin.dra.values import quantity
from nvidia_device_plugin.plans.resources import AdvertisedDevice, whole_gpu_device

# NVIDIA names the whole-GPU DeviceClass after its driver (dra/names.py's DRIVER_NAME, which imports this).
GPU_CLASS = "gpu.nvidia.com"


def gpu_device_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}"


@dataclass(frozen=True)
class WholeGpu:
    name: str = "gpu"
    device_class: str = GPU_CLASS

    def device(self, gpu: Gpu) -> DraDevice:
        return DraDevice(gpu_device_name(gpu), gpu, None, self)

    def devices(self, gpu: Gpu) -> list[DraDevice]:
        return [] if gpu.mig_enabled and gpu.mig_devices else [self.device(gpu)]

    def uuid(self, device: DraDevice) -> str:
        return device.gpu.uuid

    def attributes(self, device: DraDevice) -> Json:
        return {"type": {"string": self.name}, "uuid": {"string": device.gpu.uuid}}

    def capacity(self, device: DraDevice) -> Json:
        return {"memory": {"value": quantity(device.gpu.memory_bytes)}}

    def advertised(self, device: DraDevice) -> AdvertisedDevice:
        return whole_gpu_device(device.gpu)


GPU = WholeGpu()

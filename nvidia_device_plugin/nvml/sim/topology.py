"""The simulated pynvml functions of topology: NVLink state and remotes, PCIe common ancestors."""

from __future__ import annotations

import pynvml

from nvidia_device_plugin.nvml.api import DeviceHandle, PciInfo
from nvidia_device_plugin.nvml.sim.state import SimulatorState, _nvml_error, pynvml_function


class TopologyQueries(SimulatorState):
    """pynvml's NVLink and PCIe topology calls on the simulated node."""

    @pynvml_function
    def nvmlDeviceGetNvLinkState(self, device: DeviceHandle, link: int) -> int:
        gpu, mig = self._device(device)
        if mig:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        targets = self._link_targets(gpu)
        if not targets:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(pynvml.NVML_FEATURE_ENABLED if link < len(targets) else pynvml.NVML_FEATURE_DISABLED)

    @pynvml_function
    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: DeviceHandle, link: int) -> PciInfo:
        gpu, _ = self._device(device)
        targets = self._link_targets(gpu)
        if not 0 <= link < len(targets):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._pci_info(targets[link][1])

    @pynvml_function
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: DeviceHandle, link: int) -> int:
        gpu, _ = self._device(handle)
        targets = self._link_targets(gpu)
        if not 0 <= link < len(targets):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return targets[link][0]

    @pynvml_function
    def nvmlDeviceGetTopologyCommonAncestor(self, device1: DeviceHandle, device2: DeviceHandle) -> int:
        a, _ = self._device(device1)
        b, _ = self._device(device2)
        if a.index == b.index:
            return int(pynvml.NVML_TOPOLOGY_INTERNAL)
        if a.pcie_switch is not None and a.pcie_switch == b.pcie_switch:
            return int(pynvml.NVML_TOPOLOGY_SINGLE)
        if a.numa_node == b.numa_node:
            return int(pynvml.NVML_TOPOLOGY_NODE)
        return int(pynvml.NVML_TOPOLOGY_SYSTEM)

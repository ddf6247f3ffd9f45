"""A stand-in for the `pynvml` module, driven by a NodeSpec.

It implements exactly the pynvml functions of `NvmlApi` (nvml/api.py), with pynvml's names, arguments,
return types (the same ctypes structs and handle pointer types) and `pynvml.NVMLError` codes, so
discovery and health code cannot tell it from a real node. Constants, structs and exception classes are
looked up on the real pynvml module; an `nvml*` function it does not implement is an AttributeError
naming it, never a silent fall-through to the real library. Methods outside pynvml's API (inject_xid,
set_lost, fail_next, interrupt_event_wait, materialize_host) are the simulation's controls.
"""

from __future__ import annotations

import ctypes
import functools
import tempfile
import threading
import types
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import pynvml

from nvidia_device_plugin.nvml.api import (
    DeviceAttributes,
    DeviceHandle,
    EventData,
    EventSetHandle,
    MemoryInfo,
    PciInfo,
)
from nvidia_device_plugin.nvml.host import HostPaths
from nvidia_device_plugin.nvml.node import GpuSpec, MigSpec, NodeSpec
from nvidia_device_plugin.nvml.sim_host import gpu_minor, materialize_host, mig_instance_ids

F = TypeVar("F", bound=Callable[..., Any])

_GPU_STRIDE = 0x10000
_MIG_STRIDE = 0x100
_EVENT_SET_BASE = 0x7F000000
NOT_ATTRIBUTED = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of an event not tied to a MIG instance


def _nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _address(handle: object) -> int:
    value = ctypes.cast(cast(Any, handle), ctypes.c_void_p).value
    if value is None:
        raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return value


@dataclass
class _EventSet:
    address: int
    masks: dict[int, int] = field(default_factory=dict)  # GPU index -> registered event types
    queue: deque[tuple[int, int, int, int, int]] = field(default_factory=deque)
    woken: bool = False  # interrupt_event_wait was called: the next wait with nothing queued returns


def _api(fn: F) -> F:
    """Marks a pynvml function: checks init, applies injected failures, holds the lock."""

    @functools.wraps(fn)
    def wrapper(self: SimulatedNvml, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self._maybe_fail(fn.__name__)
            if fn.__name__ != "nvmlInit" and self._init_count == 0:
                raise _nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        return fn(self, *args, **kwargs)

    wrapper.__dict__["pynvml_api"] = True
    return wrapper  # type: ignore[return-value]


class SimulatedNvml:
    """pynvml, as seen on the simulated node."""

    def __init__(self, node: NodeSpec) -> None:
        self.node = node
        self._lock = threading.RLock()
        self._events_ready = threading.Condition(self._lock)
        self._init_count = 0
        self._lost: set[int] = set()
        self._failures: dict[str, deque[int]] = {}
        self._event_sets: dict[int, _EventSet] = {}
        self._next_event_set = _EVENT_SET_BASE
        self._host_dir: tempfile.TemporaryDirectory[str] | None = None
        self._host: HostPaths | None = None

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not defined on the class. A missing function must fail here, loudly:
        # forwarding it to the real pynvml would surface as NVMLError_Uninitialized far from the cause.
        if name.startswith("nvml") and isinstance(getattr(pynvml, name, None), types.FunctionType):
            raise AttributeError(
                f"the pynvml simulator does not implement {name}; add it to nvml/simulator.py "
                "(and to NvmlApi in nvml/api.py)"
            )
        # Constants, structs and exception classes are pynvml's own.
        return getattr(pynvml, name)

    # ---- simulation controls (not pynvml) ---------------------------------------------------------

    def inject_xid(self, target: int | str, xid: int) -> None:
        self._inject(target, pynvml.nvmlEventTypeXidCriticalError, xid)

    def inject_ecc_double_bit(self, target: int | str) -> None:
        self._inject(target, pynvml.nvmlEventTypeDoubleBitEccError, 0)

    def set_lost(self, target: int | str, lost: bool) -> None:
        gpu, _ = self._resolve_target(target)
        with self._lock:
            if lost:
                self._lost.add(gpu.index)
            else:
                self._lost.discard(gpu.index)

    def fail_next(self, function_name: str, code: int, count: int = 1) -> None:
        if not getattr(getattr(type(self), function_name, None), "pynvml_api", False):
            raise ValueError(f"{function_name} is not a simulated pynvml function")
        with self._lock:
            self._failures.setdefault(function_name, deque()).extend([code] * count)

    def interrupt_event_wait(self, eventSet: EventSetHandle) -> None:
        """Make a wait on `eventSet` with nothing queued return NVML_ERROR_TIMEOUT now (or the next one).

        Not pynvml: real nvmlEventSetWait cannot be interrupted. It lets a monitor stop without waiting
        out its timeout; see nvml/events.py:interrupt_wait.
        """
        with self._events_ready:
            event_set = self._event_sets.get(_address(eventSet))
            if event_set is not None:
                event_set.woken = True
                self._events_ready.notify_all()

    def materialize_host(self) -> HostPaths:
        """A throwaway sysfs, procfs and /dev tree for this node (see nvml/sim_host.py); made once."""
        with self._lock:
            if self._host is None:
                self._host_dir = tempfile.TemporaryDirectory(prefix="nvdp-host-")
                self._host = materialize_host(self.node, Path(self._host_dir.name))
            return self._host

    def close(self) -> None:
        with self._lock:
            if self._host_dir is not None:
                self._host_dir.cleanup()
                self._host_dir = None
                self._host = None

    # ---- pynvml: library ----------------------------------------------------------------------

    @_api
    def nvmlInit(self) -> None:
        with self._lock:
            self._init_count += 1

    @_api
    def nvmlShutdown(self) -> None:
        with self._lock:
            self._init_count -= 1

    @_api
    def nvmlSystemGetDriverVersion(self) -> str:
        return self.node.driver_version

    @_api
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.node.cuda_driver_version

    # ---- pynvml: device handles ---------------------------------------------------------------

    @_api
    def nvmlDeviceGetCount(self) -> int:
        return len(self.node.gpus)

    @_api
    def nvmlDeviceGetHandleByIndex(self, index: int) -> DeviceHandle:
        if not 0 <= index < len(self.node.gpus):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._check_not_lost(index)
        return self._handle(_GPU_STRIDE * (index + 1))

    @_api
    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> DeviceHandle:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.node.gpus:
            if gpu.uuid == text:
                self._check_not_lost(gpu.index)
                return self._handle(_GPU_STRIDE * (gpu.index + 1))
            for j, mig in enumerate(gpu.mig):
                if mig.uuid == text:
                    self._check_not_lost(gpu.index)
                    return self._handle(_GPU_STRIDE * (gpu.index + 1) + _MIG_STRIDE * (j + 1))
        raise _nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    @_api
    def nvmlDeviceGetUUID(self, handle: DeviceHandle) -> str:
        gpu, mig = self._device(handle)
        return mig.uuid if mig else gpu.uuid

    @_api
    def nvmlDeviceGetName(self, handle: DeviceHandle) -> str:
        gpu, mig = self._device(handle)
        return f"{gpu.name} MIG {mig.profile}" if mig else gpu.name

    @_api
    def nvmlDeviceGetMinorNumber(self, handle: DeviceHandle) -> int:
        gpu, mig = self._device(handle)
        if mig:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu_minor(gpu)

    @_api
    def nvmlDeviceGetMemoryInfo(self, handle: DeviceHandle, version: int | None = None) -> MemoryInfo:
        gpu, mig = self._device(handle)
        memory: MemoryInfo = pynvml.c_nvmlMemory_t()
        memory.total = (self._mig_memory_mb(gpu, mig) if mig else gpu.memory_mib) * 1024 * 1024
        memory.used = 0
        memory.free = memory.total
        return memory

    @_api
    def nvmlDeviceGetPciInfo(self, handle: DeviceHandle) -> PciInfo:
        gpu, _ = self._device(handle)
        return self._pci_info(gpu.pci_bus_id)

    # ---- pynvml: MIG --------------------------------------------------------------------------

    @_api
    def nvmlDeviceGetMigMode(self, device: DeviceHandle) -> list[int]:
        gpu, mig = self._device(device)
        if mig or not gpu.mig_capable:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    @_api
    def nvmlDeviceGetMaxMigDeviceCount(self, device: DeviceHandle) -> int:
        gpu, mig = self._device(device)
        if mig or not gpu.mig_capable:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 7

    @_api
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: DeviceHandle, index: int) -> DeviceHandle:
        gpu, mig = self._device(device)
        if mig or not gpu.mig_enabled:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= index < len(gpu.mig):
            raise _nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return self._handle(_GPU_STRIDE * (gpu.index + 1) + _MIG_STRIDE * (index + 1))

    @_api
    def nvmlDeviceGetGpuInstanceId(self, device: DeviceHandle) -> int:
        gpu, mig = self._device(device)
        if not mig:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig_instance_ids(gpu, mig)[0]

    @_api
    def nvmlDeviceGetComputeInstanceId(self, device: DeviceHandle) -> int:
        gpu, mig = self._device(device)
        if not mig:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig_instance_ids(gpu, mig)[1]

    @_api
    def nvmlDeviceGetAttributes(self, device: DeviceHandle) -> DeviceAttributes:
        gpu, mig = self._device(device)
        attrs: DeviceAttributes = pynvml.c_nvmlDeviceAttributes()
        if mig:
            attrs.gpuInstanceSliceCount = mig.gpu_slices
            attrs.computeInstanceSliceCount = mig.compute_slices
            attrs.multiprocessorCount = 14 * mig.compute_slices
            attrs.memorySizeMB = self._mig_memory_mb(gpu, mig)
        else:
            attrs.gpuInstanceSliceCount = 7
            attrs.computeInstanceSliceCount = 7
            attrs.multiprocessorCount = 108
            attrs.memorySizeMB = gpu.memory_mib
        return attrs

    # ---- pynvml: topology ---------------------------------------------------------------------

    @_api
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

    @_api
    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: DeviceHandle, link: int) -> PciInfo:
        gpu, _ = self._device(device)
        targets = self._link_targets(gpu)
        if not 0 <= link < len(targets):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._pci_info(targets[link][1])

    @_api
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: DeviceHandle, link: int) -> int:
        gpu, _ = self._device(handle)
        targets = self._link_targets(gpu)
        if not 0 <= link < len(targets):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return targets[link][0]

    @_api
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

    # ---- pynvml: events -----------------------------------------------------------------------

    @_api
    def nvmlDeviceGetSupportedEventTypes(self, handle: DeviceHandle) -> int:
        gpu, _ = self._device(handle)
        if not gpu.events:
            return 0
        return int(pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError)

    @_api
    def nvmlEventSetCreate(self) -> EventSetHandle:
        with self._lock:
            self._next_event_set += 0x10
            address = self._next_event_set
            self._event_sets[address] = _EventSet(address)
        return EventSetHandle(ctypes.cast(address, pynvml.c_nvmlEventSet_t))

    @_api
    def nvmlEventSetFree(self, eventSet: EventSetHandle) -> None:
        with self._lock:
            self._event_sets.pop(_address(eventSet), None)

    @_api
    def nvmlDeviceRegisterEvents(
        self, handle: DeviceHandle, eventTypes: int, eventSet: EventSetHandle
    ) -> None:
        gpu, mig = self._device(handle)
        if not gpu.events or mig:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            event_set = self._event_set(eventSet)
            event_set.masks[gpu.index] = event_set.masks.get(gpu.index, 0) | eventTypes

    @_api
    def nvmlEventSetWait_v2(self, eventSet: EventSetHandle, timeoutms: int) -> EventData:
        with self._events_ready:
            event_set = self._event_set(eventSet)
            if not event_set.queue:
                # Wakes early for an event, a freed set, or interrupt_event_wait (which real NVML lacks).
                self._events_ready.wait_for(
                    lambda: (
                        bool(event_set.queue) or event_set.woken or event_set.address not in self._event_sets
                    ),
                    timeout=timeoutms / 1000.0,
                )
            if not event_set.queue:
                event_set.woken = False
                raise _nvml_error(pynvml.NVML_ERROR_TIMEOUT)
            gpu_index, event_type, data, gi, ci = event_set.queue.popleft()
        event: EventData = pynvml.c_nvmlEventData_t()
        event.device = self._handle(_GPU_STRIDE * (gpu_index + 1))
        event.eventType = event_type
        event.eventData = data
        event.gpuInstanceId = gi
        event.computeInstanceId = ci
        return event

    # ---- internals ----------------------------------------------------------------------------

    def _maybe_fail(self, name: str) -> None:
        pending = self._failures.get(name)
        if pending:
            raise _nvml_error(pending.popleft())

    def _check_not_lost(self, index: int) -> None:
        if index in self._lost:
            raise _nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)

    @staticmethod
    def _handle(address: int) -> DeviceHandle:
        return DeviceHandle(ctypes.cast(address, pynvml.c_nvmlDevice_t))

    def _device(self, handle: DeviceHandle) -> tuple[GpuSpec, MigSpec | None]:
        address = _address(handle)
        gpu_index = address // _GPU_STRIDE - 1
        mig_index = (address % _GPU_STRIDE) // _MIG_STRIDE - 1
        if not 0 <= gpu_index < len(self.node.gpus):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.node.gpus[gpu_index]
        with self._lock:
            self._check_not_lost(gpu_index)
        if mig_index < 0:
            return gpu, None
        if mig_index >= len(gpu.mig):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, gpu.mig[mig_index]

    def _event_set(self, handle: EventSetHandle) -> _EventSet:
        event_set = self._event_sets.get(_address(handle))
        if event_set is None:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return event_set

    def _resolve_target(self, target: int | str) -> tuple[GpuSpec, MigSpec | None]:
        for gpu in self.node.gpus:
            if target in (gpu.index, gpu.uuid, str(gpu.index)):
                return gpu, None
            for mig in gpu.mig:
                if target == mig.uuid:
                    return gpu, mig
        raise ValueError(f"no simulated GPU or MIG device {target!r} on node {self.node.name}")

    def _inject(self, target: int | str, event_type: int, data: int) -> None:
        gpu, mig = self._resolve_target(target)
        gi, ci = mig_instance_ids(gpu, mig) if mig else (NOT_ATTRIBUTED, NOT_ATTRIBUTED)
        with self._events_ready:
            for event_set in self._event_sets.values():
                if event_set.masks.get(gpu.index, 0) & event_type:
                    event_set.queue.append((gpu.index, event_type, data, gi, ci))
            self._events_ready.notify_all()

    @staticmethod
    def _mig_memory_mb(gpu: GpuSpec, mig: MigSpec) -> int:
        # Slightly below the nominal share, as real MIG slices are; the profile name rounds it back up.
        total_gb = -(-gpu.memory_mib // 1024)
        return int(mig.memory_gb / total_gb * gpu.memory_mib * 0.97)

    def _link_targets(self, gpu: GpuSpec) -> list[tuple[int, str]]:
        """Per NVLink of `gpu`: (remote device type, remote PCI bus ID)."""
        targets: list[tuple[int, str]] = []
        for a, b, lanes in self.node.nvlinks:
            if gpu.index in (a, b):
                peer = self.node.gpus[b if gpu.index == a else a]
                targets += [(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, peer.pci_bus_id)] * lanes
        for k in range(self.node.nvswitch_links):
            switch_bus = f"00000000:{0xC0 + k % 6:02X}:00.0"  # six NVSwitches, as on DGX A100/H100
            targets.append((pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH, switch_bus))
        return targets

    @staticmethod
    def _pci_info(bus_id: str) -> PciInfo:
        info: Any = pynvml.nvmlPciInfo_t()  # sets fields PciInfo does not name
        domain, bus, rest = bus_id.split(":")
        info.busId = bus_id.encode()
        info.busIdLegacy = bus_id[4:].encode()
        info.domain = int(domain, 16)
        info.bus = int(bus, 16)
        info.device = int(rest.split(".")[0], 16)
        pci: PciInfo = info
        return pci

    # ---- pynvml: compute mode (mps-control-daemon) ------------------------------------------------
    # Kept at the end of the class so that parallel edits above merge cleanly. Every GPU starts in
    # DEFAULT; MIG devices have no compute mode of their own (NOT_SUPPORTED, as on a real A100/H100).

    def _compute_modes(self) -> dict[int, int]:
        modes: dict[int, int] = vars(self).setdefault("_compute_mode_by_gpu", {})
        return modes

    @_api
    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        gpu, mig = self._device(handle)
        if mig:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            mode: int = self._compute_modes().get(gpu.index, pynvml.NVML_COMPUTEMODE_DEFAULT)
        return mode

    @_api
    def nvmlDeviceSetComputeMode(self, handle: Any, mode: int) -> None:
        gpu, mig = self._device(handle)
        if mig:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if mode not in (
            pynvml.NVML_COMPUTEMODE_DEFAULT,
            pynvml.NVML_COMPUTEMODE_PROHIBITED,
            pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
        ):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            self._compute_modes()[gpu.index] = mode


def simulated_functions() -> list[str]:
    """Names of the pynvml functions this simulator implements."""
    return sorted(n for n, v in vars(SimulatedNvml).items() if getattr(v, "pynvml_api", False))

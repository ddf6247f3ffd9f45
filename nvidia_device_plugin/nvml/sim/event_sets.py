"""The simulated pynvml functions of events: event sets, registration, and the wait that reads them.

Events enter through the controls of SimulatorState (inject_xid, inject_ecc_double_bit, set_lost), or from
a file through events.py's feeder.
"""

from __future__ import annotations

import ctypes

import pynvml

from nvidia_device_plugin.nvml.api import DeviceHandle, EventData, EventSetHandle
from nvidia_device_plugin.nvml.sim.state import (
    _GPU_STRIDE,
    SimulatorState,
    _address,
    _EventSet,
    _nvml_error,
    pynvml_function,
)


class EventQueries(SimulatorState):
    """pynvml's event calls on the simulated node."""

    @pynvml_function
    def nvmlDeviceGetSupportedEventTypes(self, handle: DeviceHandle) -> int:
        gpu, _ = self._device(handle)
        if not gpu.events:
            return 0
        return int(pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError)

    @pynvml_function
    def nvmlEventSetCreate(self) -> EventSetHandle:
        with self._lock:
            self._next_event_set += 0x10
            address = self._next_event_set
            self._event_sets[address] = _EventSet(address)
        return EventSetHandle(ctypes.cast(address, pynvml.c_nvmlEventSet_t))

    @pynvml_function
    def nvmlEventSetFree(self, eventSet: EventSetHandle) -> None:
        with self._lock:
            self._event_sets.pop(_address(eventSet), None)

    @pynvml_function
    def nvmlDeviceRegisterEvents(
        self, handle: DeviceHandle, eventTypes: int, eventSet: EventSetHandle
    ) -> None:
        gpu, mig = self._device(handle)
        if not gpu.events or mig:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if self.node.unprivileged_container and gpu.mig_enabled:
            # XIDs attributed to MIG instances need CAP_SYS_ADMIN.
            raise _nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        with self._lock:
            event_set = self._event_set(eventSet)
            event_set.masks[gpu.index] = event_set.masks.get(gpu.index, 0) | eventTypes

    @pynvml_function
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
                if self.lost_fails_event_wait and any(i in self._lost for i in event_set.masks):
                    raise _nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
                raise _nvml_error(pynvml.NVML_ERROR_TIMEOUT)
            gpu_index, event_type, data, gi, ci = event_set.queue.popleft()
        event: EventData = pynvml.c_nvmlEventData_t()
        event.device = self._handle(_GPU_STRIDE * (gpu_index + 1))
        event.eventType = event_type
        event.eventData = data
        event.gpuInstanceId = gi
        event.computeInstanceId = ci
        return event

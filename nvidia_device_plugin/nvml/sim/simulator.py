"""A stand-in for the `pynvml` module, driven by a NodeSpec.

It implements exactly the pynvml functions of `NvmlApi` (nvml/api.py), with pynvml's names, arguments,
return types (the same ctypes structs and handle pointer types) and `pynvml.NVMLError` codes, so
discovery and health code cannot tell it from a real node. Constants, structs and exception classes are
looked up on the real pynvml module; an `nvml*` function it does not implement is an AttributeError
naming it, never a silent fall-through to the real library. Methods outside pynvml's API (inject_xid,
set_lost, fail_next, interrupt_event_wait, materialize_host) are the simulation's controls (state.py).

The functions live by job: devices.py (handles, identity, health counters, compute mode), mig.py,
mig_management.py (making and destroying MIG instances), topology.py and event_sets.py; this class puts
them together with the library calls.
"""

from __future__ import annotations

import types
from typing import Any

import pynvml

from nvidia_device_plugin.nvml.sim.devices import DeviceQueries
from nvidia_device_plugin.nvml.sim.event_sets import EventQueries
from nvidia_device_plugin.nvml.sim.mig import MigQueries
from nvidia_device_plugin.nvml.sim.mig_management import MigManagement
from nvidia_device_plugin.nvml.sim.state import pynvml_function
from nvidia_device_plugin.nvml.sim.topology import TopologyQueries


class SimulatedNvml(DeviceQueries, MigQueries, MigManagement, TopologyQueries, EventQueries):
    """pynvml, as seen on the simulated node."""

    def __getattr__(self, name: str) -> Any:
        # Only reached for names no class of the simulator defines. A missing function must fail here:
        # forwarding it to the real pynvml would surface as NVMLError_Uninitialized far from the cause.
        if name.startswith("nvml") and isinstance(getattr(pynvml, name, None), types.FunctionType):
            raise AttributeError(
                f"the pynvml simulator does not implement {name}; add it to nvml/sim/ (devices, mig, "
                "topology or event_sets, by job) and to NvmlApi in nvml/api.py"
            )
        # Constants, structs and exception classes are pynvml's own.
        return getattr(pynvml, name)

    # ---- pynvml: library ----------------------------------------------------------------------

    @pynvml_function
    def nvmlInit(self) -> None:
        with self._lock:
            self._init_count += 1

    @pynvml_function
    def nvmlShutdown(self) -> None:
        with self._lock:
            self._init_count -= 1

    @pynvml_function
    def nvmlSystemGetDriverVersion(self) -> str:
        return self.node.driver_version

    @pynvml_function
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.node.cuda_driver_version


def simulated_functions() -> list[str]:
    """Names of the pynvml functions this simulator implements (on SimulatedNvml or the classes it joins)."""
    return sorted(
        {
            name
            for cls in SimulatedNvml.__mro__
            for name, value in vars(cls).items()
            if getattr(value, "pynvml_api", False)
        }
    )

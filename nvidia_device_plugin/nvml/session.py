"""Choosing the NVML implementation: the real pynvml module, or a SimulatedNvml for `--simulate NODE`.

A session is a context manager (`with open_nvml(node) as session:`) for code that reads the node and is
done; the daemons keep theirs open for their whole life and call close() when they stop. Every call made
through `session.nv` has a deadline (nvml/bounded.py); `session.calls` is that bound, for listeners.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, cast

import pynvml

from nvidia_device_plugin.nvml.api import NvmlApi
from nvidia_device_plugin.nvml.bounded import BoundedNvml
from nvidia_device_plugin.nvml.deadlines import DEFAULT_CALL_TIMEOUT_S
from nvidia_device_plugin.nvml.errors import nvml_call
from nvidia_device_plugin.nvml.host import REAL_HOST, HostPaths

if TYPE_CHECKING:  # a real node never loads the simulator
    from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml
    from nvidia_device_plugin.nvml.timeslice import TimeSliceControl

log = logging.getLogger(__name__)


@dataclass
class NvmlSession:
    """An initialised NVML (`nv`), and the host tree (sysfs, procfs, /dev) of the node it describes."""

    nv: NvmlApi
    host: HostPaths
    simulator: SimulatedNvml | None
    calls: BoundedNvml | None = None  # the deadline every call of `nv` runs under; None: unbounded

    def __enter__(self) -> NvmlSession:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def time_slices(self) -> TimeSliceControl:
        """How the compute time-slices of this node's GPUs are set: nvidia-smi on a real node (NVML has no
        call for it), the simulator's own on a simulated one."""
        if self.simulator is not None:
            return self.simulator.time_slices
        from nvidia_device_plugin.nvml.timeslice import NvidiaSmiTimeSlice

        return NvidiaSmiTimeSlice()

    def close(self) -> None:
        """Shut NVML down (a failure is logged, not raised; never waiting on a stuck call, see
        BoundedNvml.shutdown) and remove a simulated node's host tree."""
        if self.calls is not None:
            self.calls.shutdown()
        else:
            try:
                self.nv.nvmlShutdown()
            except pynvml.NVMLError as exc:
                log.warning("NVML shutdown failed: %s", exc)
        if self.simulator is not None:
            self.simulator.close()  # releases simulated hangs, so no lane stays blocked
        if self.calls is not None:
            self.calls.close()


def open_nvml(simulate: str | None = None, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> NvmlSession:
    """Initialise NVML; raises NvmlError ("NVIDIA driver library not found: ...") on a node without one.

    Every NVML call of the session returns within `call_timeout_s` (an event wait: plus its timeout), or
    fails as stuck (nvml/bounded.py).
    """
    if simulate:
        from nvidia_device_plugin.nvml.sim.node import load_node
        from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml

        sim = SimulatedNvml(load_node(simulate))
        # Typed as NvmlApi here, so mypy checks that the simulator implements the whole API.
        api: NvmlApi = sim
        calls = BoundedNvml(api, call_timeout_s)
        nv = _initialised(calls, "initialising simulated NVML")
        log.info("NVML simulated: node %s with %d GPUs", sim.node.name, len(sim.node.gpus))
        return NvmlSession(nv=nv, host=sim.materialize_host(), simulator=sim, calls=calls)
    calls = BoundedNvml(pynvml, call_timeout_s)
    nv = _initialised(calls, "initialising NVML")
    return NvmlSession(nv=nv, host=REAL_HOST, simulator=None, calls=calls)


def _initialised(calls: BoundedNvml, what: str) -> NvmlApi:
    """`calls` as the NvmlApi it stands for, once nvmlInit went through it."""
    nv = cast(NvmlApi, calls)
    try:
        nvml_call(nv.nvmlInit, what=what)
    except BaseException:
        calls.close()
        raise
    return nv

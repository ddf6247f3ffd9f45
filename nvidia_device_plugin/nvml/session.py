"""Choosing the NVML implementation: the real pynvml module, or a SimulatedNvml for `--simulate NODE`.

A session is a context manager (`with open_nvml(node) as session:`) for code that reads the node and is
done; the daemons keep theirs open for their whole life and call close() when they stop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

import pynvml

from nvidia_device_plugin.nvml.api import NvmlApi
from nvidia_device_plugin.nvml.errors import nvml_call
from nvidia_device_plugin.nvml.host import REAL_HOST, HostPaths

if TYPE_CHECKING:  # a real node never loads the simulator
    from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml

log = logging.getLogger(__name__)


@dataclass
class NvmlSession:
    """An initialised NVML (`nv`), and the host tree (sysfs, procfs, /dev) of the node it describes."""

    nv: NvmlApi
    host: HostPaths
    simulator: SimulatedNvml | None

    def __enter__(self) -> NvmlSession:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Shut NVML down (a failure is logged, not raised) and remove a simulated node's host tree."""
        try:
            self.nv.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.warning("NVML shutdown failed: %s", exc)
        if self.simulator is not None:
            self.simulator.close()


def open_nvml(simulate: str | None = None) -> NvmlSession:
    """Initialise NVML; raises NvmlError ("NVIDIA driver library not found: ...") on a node without one."""
    if simulate:
        from nvidia_device_plugin.nvml.sim.node import load_node
        from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml

        sim = SimulatedNvml(load_node(simulate))
        nvml_call(sim.nvmlInit, what="initialising simulated NVML")
        log.info("NVML simulated: node %s with %d GPUs", sim.node.name, len(sim.node.gpus))
        # Typed as NvmlApi here, so mypy checks that the simulator implements the whole API.
        api: NvmlApi = sim
        return NvmlSession(nv=api, host=sim.materialize_host(), simulator=sim)
    nvml_call(pynvml.nvmlInit, what="initialising NVML")
    return NvmlSession(nv=pynvml, host=REAL_HOST, simulator=None)

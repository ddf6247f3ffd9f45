"""Choosing the NVML implementation: the real pynvml module, or a SimulatedNvml for `--simulate NODE`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from nvidia_device_plugin.nvml.errors import nvml_call
from nvidia_device_plugin.nvml.node import load_node
from nvidia_device_plugin.nvml.simulator import SimulatedNvml

log = logging.getLogger(__name__)


@dataclass
class NvmlSession:
    """An initialised NVML: `nv` has pynvml's API; `sysfs_root` is where PCI NUMA nodes are read."""

    nv: Any
    sysfs_root: Path
    simulator: SimulatedNvml | None

    @property
    def simulated(self) -> bool:
        return self.simulator is not None

    def close(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.warning("NVML shutdown failed: %s", exc)
        if self.simulator is not None:
            self.simulator.close()


def open_nvml(simulate: str | None = None) -> NvmlSession:
    """Initialise NVML; raises NvmlError ("NVIDIA driver library not found: ...") on a node without one."""
    if simulate:
        sim = SimulatedNvml(load_node(simulate))
        nvml_call(sim.nvmlInit, what="initialising simulated NVML")
        log.info("NVML simulated: node %s with %d GPUs", sim.node.name, len(sim.node.gpus))
        return NvmlSession(nv=sim, sysfs_root=sim.materialize_sysfs(), simulator=sim)
    nvml_call(pynvml.nvmlInit, what="initialising NVML")
    return NvmlSession(nv=pynvml, sysfs_root=Path("/sys"), simulator=None)

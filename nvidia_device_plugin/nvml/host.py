"""Where the host's kernel interfaces are: sysfs (NUMA nodes), procfs (MIG capabilities), /dev (nodes).

An NVML session carries them, so a simulated node brings its own throwaway tree and everything that
reads the host (discovery, Allocate's device specs) reads the same node NVML describes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HostPaths:
    """Where this process finds the host's sysfs, procfs, /dev and driver root (simulated: its own tree)."""

    sysfs_root: Path  # holds bus/pci/devices/<bus id>/numa_node
    proc_root: Path  # holds driver/nvidia/capabilities/... and driver/nvidia-caps/mig-minors
    dev_root: Path  # the root under which dev/nvidiactl, dev/nvidia<minor>, dev/nvidia-caps/ are
    # The driver root as this process sees it (CDI specs name its libraries); None: containerDriverRoot.
    driver_root: Path | None = None
    # The root the CDI spec directory (cdiSpecDir) is under: "/" on a real node; a simulated node keeps
    # its specs in its own tree, so they never shadow a real node's specs for the same devices.
    spec_root: Path = Path("/")


REAL_HOST = HostPaths(sysfs_root=Path("/sys"), proc_root=Path("/proc"), dev_root=Path("/"))

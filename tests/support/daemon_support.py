"""Starting an in-process daemon on a simulated node, shared by the end-to-end test files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.daemons.run import Daemon, DaemonOptions
from nvidia_device_plugin.nvml.session import NvmlSession, open_nvml
from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml

GPU = "nvidia.com/gpu"


def simulated(node: str) -> Callable[[], NvmlSession]:
    """What the CLI hands the daemon for --simulate NODE: a function opening a simulated session."""
    return lambda: open_nvml(node)


def simulated_options(
    plugin_dir: Path, node: str = "dgx-a100", load_config: Callable[[], Config] = Config, **more: Any
) -> DaemonOptions:
    return DaemonOptions(plugin_dir=plugin_dir, load_config=load_config, open_nvml=simulated(node), **more)


def start_daemon(
    plugin_dir: Path, node: str = "dgx-a100", load_config: Callable[[], Config] = Config, **more: Any
) -> Daemon:
    daemon = Daemon(simulated_options(plugin_dir, node, load_config, **more))
    daemon.start()
    return daemon


def gpu_uuids(daemon: Daemon) -> list[str]:
    """UUIDs of the daemon's GPUs, by GPU index."""
    assert daemon.snapshot is not None
    return [g.uuid for g in sorted(daemon.snapshot.inventory.gpus, key=lambda g: g.index)]


def simulator(daemon: Daemon) -> SimulatedNvml:
    assert daemon.nvml is not None and daemon.nvml.simulator is not None
    return daemon.nvml.simulator

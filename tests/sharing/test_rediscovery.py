"""A GPU lost at start that comes back is re-discovered in both processes, and everything derived from it
follows: the control daemon's MPS limits, the plugin's Allocate limits and health, labels, NUMA and links.

Both daemons run in process on a simulated pcie-nvlink-pairs node whose GPU 3 answers GPU_IS_LOST to
nvmlDeviceGetMemoryInfo when they start (so it is served lost, its memory unknown), until the test lets it
read again; kubelet's view is the stand-in's over the real sockets.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from nvidia_device_plugin.config.loader import parse_config_text
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.daemons.run import Daemon, DaemonOptions
from nvidia_device_plugin.labels.writer import LabelsOptions
from nvidia_device_plugin.nvml.session import NvmlSession, open_nvml
from nvidia_device_plugin.sharing.readiness import read_status, status_path
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU
from support.fake_mps import install_fake_control, kill_fake_daemons, lines, started_control_daemon
from support.waiting import wait_for

NODE = "pcie-nvlink-pairs"  # 4 x A100 PCIe 40 GB, NVLink bridges 0-1 and 2-3, NUMA 0, 0, 1, 1
REDISCOVERY_S = 0.05
SHARE_MIB = 40960 // 2  # two replicas per GPU


def _lost_gpu_3() -> NvmlSession:
    session = open_nvml(NODE)
    assert session.simulator is not None
    session.simulator.fail_always("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST, gpu=3)
    return session


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_fake_daemons(tmp_path)


def test_a_gpu_lost_at_start_that_reads_again_is_rediscovered_by_both_daemons(
    root: Path, plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    mps_root = root / "mps"
    text = (
        f"version: v1\nflags:\n  mpsRoot: {mps_root}\nsharing:\n  mps:\n"
        f"    resources:\n    - name: {GPU}\n      replicas: 2\n"
    )

    def config() -> Config:
        return parse_config_text(text)

    control = started_control_daemon(
        config, _lost_gpu_3, install_fake_control(root), rediscovery_interval_s=REDISCOVERY_S
    )
    labels = root / "labels"
    plugin = Daemon(
        DaemonOptions(
            plugin_dir=plugin_dir,
            load_config=config,
            open_nvml=_lost_gpu_3,
            mps_poll_interval_s=0.02,
            labels=LabelsOptions(labels, no_timestamp=True),
            rediscovery_interval_s=REDISCOVERY_S,
        )
    )
    plugin.start()
    try:
        assert plugin.snapshot is not None and control.snapshot is not None
        gpu3 = plugin.snapshot.inventory.gpus[3]
        assert gpu3.lost and gpu3.memory_bytes == 0
        pipe = mps_root / GPU / gpu3.uuid / "pipe"
        wait_for(lambda: read_status(status_path(str(mps_root), GPU, gpu3.uuid)).ready, "GPU 3's daemon")
        assert not any(" 0M" in line for line in lines(pipe / "commands"))  # no limit while memory unknown
        assert kubelet.wait_for_resources([GPU])
        assert kubelet.wait_for(lambda: kubelet.devices(GPU)[f"{gpu3.uuid}::0"].health == "Unhealthy")

        for daemon in (control, plugin):  # GPU 3 reads again
            assert daemon.nvml is not None and daemon.nvml.simulator is not None
            daemon.nvml.simulator.clear_failures()

        limit = f"set_default_device_pinned_mem_limit 0 {SHARE_MIB}M"
        wait_for(lambda: limit in lines(pipe / "commands"), "the control daemon's real limit for GPU 3")
        assert kubelet.wait_for(lambda: kubelet.devices(GPU)[f"{gpu3.uuid}::0"].health == "Healthy")
        response = kubelet.allocate(GPU, [[f"{gpu3.uuid}::0"]]).container_responses[0]
        assert response.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={SHARE_MIB}M"
        fresh = plugin.snapshot.inventory
        assert not fresh.gpus[3].lost and fresh.gpus[3].numa_node == 1
        assert next(ln for ln in fresh.links if (ln.a, ln.b) == (2, 3)).nvlinks == 12
        assert control.snapshot.inventory.gpus[3].memory_bytes == 40960 * 1024 * 1024
        wait_for(lambda: "nvdp.nvidia.com/gpu.healthy=4" in labels.read_text().splitlines(), "the labels")
        assert {"nvdp.nvidia.com/numa.gpus-per-node=2-2", "nvidia.com/gpu.memory=40960"} <= set(
            labels.read_text().splitlines()
        )
    finally:
        plugin.stop()
        control.stop()

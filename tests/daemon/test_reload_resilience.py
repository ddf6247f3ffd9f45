"""Reloads on a node that misbehaves: a lost GPU does not block them, and one rejected for a transient
NVML failure is tried again by itself. In-process daemon on a simulated node, kubelet stand-in over
real sockets."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from nvidia_device_plugin import daemon as daemon_module
from nvidia_device_plugin.config.v1 import Config, ReplicatedResource, ReplicatedResources, Sharing
from nvidia_device_plugin.plugin.kubelet_standin import KubeletStandIn

from support.daemon_support import GPU, gpu_uuids, simulator, start_daemon


def time_sliced(replicas: int) -> Config:
    entry = ReplicatedResource(name=GPU, replicas=replicas)
    return Config(sharing=Sharing(time_slicing=ReplicatedResources(resources=(entry,))))


def test_a_lost_gpu_does_not_block_a_reload_and_is_served_unhealthy(
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    configs = [Config()]
    daemon = start_daemon(plugin_dir, load_config=lambda: configs[-1])
    try:
        assert kubelet.wait_for_resources([GPU])
        lost = gpu_uuids(daemon)[3]
        simulator(daemon).set_lost(3, True)
        configs.append(time_sliced(2))
        assert daemon.reload("test"), "a lost GPU must not make the reload fail"
        assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 16)
        health = {i: d.health for i, d in kubelet.devices(GPU).items()}
        assert {health[f"{lost}::{r}"] for r in range(2)} == {"Unhealthy"}
        assert sum(h == "Healthy" for h in health.values()) == 14
    finally:
        daemon.stop()


def test_a_reload_rejected_for_an_nvml_failure_is_retried_and_lands(
    plugin_dir: Path, kubelet: KubeletStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(daemon_module, "RELOAD_RETRY_MIN_S", 0.05)
    configs = [Config()]
    daemon = start_daemon(plugin_dir, load_config=lambda: configs[-1])
    try:
        assert kubelet.wait_for_resources([GPU])
        # The driver answers UNKNOWN twice (a GPU reset in progress, say), then works again.
        simulator(daemon).fail_next("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN, count=2)
        configs.append(time_sliced(3))
        assert not daemon.reload("test")
        assert len(kubelet.devices(GPU)) == 8  # still the last good config
        assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 24, timeout=10)
    finally:
        daemon.stop()

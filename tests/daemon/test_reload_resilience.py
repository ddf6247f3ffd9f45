"""Reloads on a node that misbehaves: a lost GPU does not block them, and one rejected for a transient
NVML failure is tried again by itself, with backoff (daemons/follower.py: SnapshotFollower). In-process
daemon on a simulated node, kubelet stand-in over real sockets."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.v1 import Config, ReplicatedResource, ReplicatedResources, Sharing
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.checks import assert_all
from support.daemon_support import GPU, gpu_uuids, simulator, start_daemon
from support.waiting import scaled


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
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    configs = [Config()]
    # The retries land 1.5 s after the reload: the look at what kubelet has before them must come first.
    daemon = start_daemon(plugin_dir, load_config=lambda: configs[-1], reload_retry_min_s=0.5)
    try:
        assert kubelet.wait_for_resources([GPU])
        # The driver answers UNKNOWN twice (a GPU reset in progress, say), then works again.
        simulator(daemon).fail_next("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN, count=2)
        configs.append(time_sliced(3))
        assert not daemon.reload("test")
        assert len(kubelet.devices(GPU)) == 8  # still the last good config
        assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 24, timeout=scaled(10))
    finally:
        daemon.stop()


def retry_delays(caplog: pytest.LogCaptureFixture) -> list[str]:
    prefix = "retrying the config reload in "
    return [
        r.getMessage().removeprefix(prefix).split(" ")[0] for r in caplog.records if prefix in r.getMessage()
    ]


def test_reload_retries_back_off_doubling_to_the_cap_and_start_again_from_the_first_delay(
    plugin_dir: Path,
    kubelet: KubeletStandIn,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="nvidia_device_plugin.daemons.follower")
    configs = [Config()]
    daemon = start_daemon(
        plugin_dir, load_config=lambda: configs[-1], reload_retry_min_s=0.01, reload_retry_max_s=0.04
    )
    try:
        assert kubelet.wait_for_resources([GPU])
        simulator(daemon).fail_next("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN, count=4)
        configs.append(time_sliced(2))
        assert not daemon.reload("test")  # and three retries fail after it; the fourth lands
        assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 16, timeout=scaled(10))
        assert retry_delays(caplog) == ["0.01s", "0.02s", "0.04s", "0.04s"]
        rejected = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
        assert len(rejected) == 4
        assert_all(rejected, lambda line: "still serving the previous config" in line)

        # A reload that lands resets the backoff: the next NVML failure is retried after the first delay.
        simulator(daemon).fail_next("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN, count=1)
        configs.append(time_sliced(3))
        assert not daemon.reload("again")
        assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 24, timeout=scaled(10))
        assert retry_delays(caplog)[4:] == ["0.01s"]
    finally:
        daemon.stop()


def test_a_config_error_is_not_retried(
    plugin_dir: Path,
    kubelet: KubeletStandIn,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="nvidia_device_plugin.daemons.follower")

    def broken() -> Config:
        raise ConfigError("sharing.timeSlicing.resources[0].replicas must be >= 1, got 0")

    loaders: list[Callable[[], Config]] = [Config]
    daemon = start_daemon(plugin_dir, load_config=lambda: loaders[-1](), reload_retry_min_s=0.01)
    try:
        assert kubelet.wait_for_resources([GPU])
        loaders.append(broken)
        assert not daemon.reload("test")
        assert len(kubelet.devices(GPU)) == 8  # the last good config
        assert retry_delays(caplog) == []  # only NVML failures are transient
        assert "config reload (test) rejected, still serving the previous config: sharing" in caplog.text
    finally:
        daemon.stop()

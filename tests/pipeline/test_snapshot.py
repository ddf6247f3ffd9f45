"""The one pipeline, and the limits it enforces on what it would hand kubelet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.v1 import Config, ReplicatedResource, ReplicatedResources, Sharing
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.plans.device_lists import KUBELET_RECEIVE_LIMIT, check_device_list_sizes
from nvidia_device_plugin.snapshot import build_snapshot
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU, start_daemon
from support.waiting import scaled

NODE_16 = str(Path(__file__).resolve().parents[2] / "bench" / "nodes" / "nvswitch-16.yaml")


def time_sliced(replicas: int) -> Config:
    entry = ReplicatedResource(name=GPU, replicas=replicas)
    return Config(sharing=Sharing(time_slicing=ReplicatedResources(resources=(entry,))))


def test_the_pipeline_builds_inventory_plans_and_allocation_settings() -> None:
    session = open_nvml("dgx-a100")
    try:
        snapshot = build_snapshot(session, time_sliced(2))
    finally:
        session.close()
    assert len(snapshot.inventory.gpus) == 8
    assert [(p.name, len(p.devices)) for p in snapshot.plans] == [(GPU, 16)]
    assert snapshot.allocation.device_list_strategy == ("envvar",)


def test_a_device_list_over_kubelets_receive_limit_is_refused_naming_the_resource_and_size() -> None:
    session = open_nvml(NODE_16)
    try:
        build_snapshot(session, time_sliced(3000))  # 48,000 IDs: under the limit
        with pytest.raises(
            ConfigError, match=r"nvidia\.com/gpu would advertise 65536 devices .* bytes, over"
        ):
            build_snapshot(session, time_sliced(4096))
    finally:
        session.close()


def test_the_size_check_measures_the_encoded_message() -> None:
    session = open_nvml(NODE_16)
    try:
        plans = build_snapshot(session, time_sliced(3000)).plans
    finally:
        session.close()
    check_device_list_sizes(plans)
    assert KUBELET_RECEIVE_LIMIT == 4 * 1024 * 1024


def test_check_config_and_plan_refuse_a_list_kubelet_would_drop(tmp_path: Path) -> None:
    config = tmp_path / "huge.yaml"
    config.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "      - {name: nvidia.com/gpu, replicas: 4096}\n"
    )
    check = subprocess.run(
        [sys.executable, "-m", "nvidia_device_plugin", "check-config", str(config)],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert check.returncode == 1
    assert "sharing.timeSlicing resource nvidia.com/gpu with replicas: 4096" in check.stderr
    assert "receive limit" in check.stderr
    plan = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvidia_device_plugin",
            "plan",
            "--simulate",
            NODE_16,
            "--config-file",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert plan.returncode == 1
    assert "receive limit" in plan.stderr


def test_a_reload_to_an_oversized_list_is_rejected_and_the_old_list_keeps_serving(
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    configs = [time_sliced(2)]
    daemon = start_daemon(plugin_dir, NODE_16, lambda: configs[-1])
    try:
        assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 32)
        configs.append(time_sliced(4096))
        assert not daemon.reload("test")
        assert len(kubelet.devices(GPU)) == 32
    finally:
        daemon.stop()

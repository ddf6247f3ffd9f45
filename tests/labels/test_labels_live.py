"""The labels file follows the daemon live: config reloads, whole-GPU health changes, a file removed by hand;
and the `labels` command as an operator runs it (`gpu-feature-discovery`: test_gfd_command.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvidia_device_plugin.cli.main import main as cli_main
from nvidia_device_plugin.config.loader import parse_config_text
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.daemons.run import Daemon
from nvidia_device_plugin.labels.nfd import parse_features
from nvidia_device_plugin.labels.writer import LabelsOptions
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU, gpu_uuids, simulator, start_daemon
from support.labels_file import read_labels
from support.waiting import wait_for

N = "nvidia.com/"
HEALTHY = "nvdp.nvidia.com/gpu.healthy"


def start(plugin_dir: Path, labels_file: Path, configs: list[Config], node: str = "dgx-a100") -> Daemon:
    machine = labels_file.parent / "product_name"
    machine.write_text("DGX A100\n")
    options = LabelsOptions(path=labels_file, machine_type_file=str(machine))
    return start_daemon(plugin_dir, node, load_config=lambda: configs[-1], labels=options)


def test_file_follows_reload_and_health(tmp_path: Path, plugin_dir: Path, kubelet: KubeletStandIn) -> None:
    labels_file = tmp_path / "features.d" / "nvidia-device-plugin"
    labels_file.parent.mkdir()
    configs = [Config()]
    daemon = start(plugin_dir, labels_file, configs)
    try:
        wait_for(lambda: read_labels(labels_file).get(N + "gpu.count") == "8", "the first labels")
        first = read_labels(labels_file)
        assert first[N + "gpu.product"] == "NVIDIA-A100-SXM4-80GB"
        assert first[N + "gpu.machine"] == "DGX-A100"
        assert first[HEALTHY] == "8"
        assert N + "gfd.timestamp" in first
        assert not list(labels_file.parent.glob(".*"))  # no temp file left behind

        configs.append(
            parse_config_text("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}")
        )
        assert daemon.reload("test")
        wait_for(lambda: read_labels(labels_file).get(N + "gpu.replicas") == "4", "the reloaded labels")
        shared = read_labels(labels_file)
        assert shared[N + "gpu.product"] == "NVIDIA-A100-SXM4-80GB-SHARED"
        assert shared[N + "gpu.sharing-strategy"] == "time-slicing"

        simulator(daemon).inject_xid(3, 79)
        wait_for(lambda: read_labels(labels_file).get(HEALTHY) == "7", "the healthy count to drop")
        # The labels file can show the reload before kubelet has the reloaded list: wait for the replica too.
        replica = f"{gpu_uuids(daemon)[3]}::0"
        assert kubelet.wait_for(
            lambda: replica in kubelet.devices(GPU) and kubelet.devices(GPU)[replica].health == "Unhealthy"
        )

        labels_file.unlink()  # removed by hand: the next change writes it again
        simulator(daemon).inject_xid(5, 79)
        wait_for(lambda: read_labels(labels_file).get(HEALTHY) == "6", "the file to come back")
    finally:
        daemon.stop()
    assert read_labels(labels_file)[HEALTHY] == "6"  # kept on stop: a restart must not unlabel the node


def test_mig_layout_change_relabels_on_reload(
    tmp_path: Path, plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    labels_file = tmp_path / "labels"
    configs = [parse_config_text("flags: {migStrategy: mixed}")]
    daemon = start(plugin_dir, labels_file, configs, node="a100-mig-mixed")
    try:
        wait_for(lambda: N + "mig-3g.40gb.count" in read_labels(labels_file), "MIG labels")
        configs.append(parse_config_text("flags: {migStrategy: single}"))
        assert daemon.reload("test")
        wait_for(
            lambda: read_labels(labels_file).get(N + "gpu.product") == "NVIDIA-A100-SXM4-80GB-MIG-INVALID",
            "the single strategy's verdict",
        )
        assert N + "mig-3g.40gb.count" not in read_labels(labels_file)
    finally:
        daemon.stop()


def test_unwritable_labels_directory_is_logged_and_serving_goes_on(
    tmp_path: Path, plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    labels_file = tmp_path / "missing-dir" / "labels"
    options = LabelsOptions(path=labels_file, machine_type_file="")
    daemon = start_daemon(plugin_dir, "t4-single", labels=options)
    try:
        assert kubelet.wait_for_resources([GPU])
        assert daemon.labels is not None
        wait_for(lambda: daemon.labels is not None and daemon.labels.failure is not None, "the failure")
        assert "cannot write the labels file" in (daemon.labels.failure or "")
        labels_file.parent.mkdir()
        wait_for(lambda: read_labels(labels_file).get(N + "gpu.product") == "Tesla-T4", "the retry")
        # the writer clears its failure just after the file lands, so wait for that too
        wait_for(lambda: daemon.labels is not None and daemon.labels.failure is None, "the failure cleared")
    finally:
        daemon.stop()


def test_labels_command_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["labels", "--simulate", "t4-single", "--output", "json", "--no-timestamp"], {}) == 0
    labels = json.loads(capsys.readouterr().out)
    assert labels[N + "gpu.product"] == "Tesla-T4"
    assert labels[N + "gpu.machine"] == "unknown"
    assert N + "gfd.timestamp" not in labels


def test_labels_command_text_with_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags: {migStrategy: single}\n")
    argv = ["labels", "--simulate", "a100-mig-single", "--config-file", str(config)]
    assert cli_main(argv, {}) == 0
    labels = parse_features(capsys.readouterr().out)
    assert labels[N + "gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    assert labels[N + "mig.strategy"] == "single"
    assert labels[N + "gfd.timestamp"].isdigit()

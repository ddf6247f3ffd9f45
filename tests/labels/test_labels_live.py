"""The labels file follows the daemon live: config reloads, whole-GPU health changes, a file removed by hand;
and the `labels` and `gpu-feature-discovery` commands as an operator runs them."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nvidia_device_plugin.cli.gfd import main as gfd_main
from nvidia_device_plugin.cli.main import main as cli_main
from nvidia_device_plugin.config.loader import parse_config_text
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.daemon import Daemon
from nvidia_device_plugin.labels.nfd import parse_features
from nvidia_device_plugin.labels.writer import LabelsOptions
from nvidia_device_plugin.plugin.kubelet_standin import KubeletStandIn

from support.daemon_support import GPU, gpu_uuids, simulator, start_daemon

N = "nvidia.com/"
HEALTHY = "nvdp.nvidia.com/gpu.healthy"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The commands configure logging for the process; later tests must get pytest's back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def wait_for(condition: Callable[[], bool], what: str, cap_s: float = 10.0) -> None:
    """Wait until `condition`; the cap only turns a hang into a failure, it is not what is tested."""
    deadline = time.monotonic() + cap_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


def read_labels(path: Path) -> dict[str, str]:
    try:
        return parse_features(path.read_text())
    except FileNotFoundError:
        return {}


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
        assert kubelet.wait_for(
            lambda: kubelet.devices(GPU)[f"{gpu_uuids(daemon)[3]}::0"].health == "Unhealthy"
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
        assert daemon.labels.failure is None
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


def test_gfd_oneshot_with_gfd_env(tmp_path: Path) -> None:
    out = tmp_path / "gfd"
    env = {
        "GFD_ONESHOT": "true",
        "GFD_OUTPUT_FILE": str(out),
        "GFD_NO_TIMESTAMP": "true",
        "GFD_MACHINE_TYPE_FILE": "",
        "MIG_STRATEGY": "mixed",
        "NVDP_SIMULATE": "h100-nvl",
    }
    assert gfd_main([], env) == 0
    labels = read_labels(out)
    assert labels[N + "mig.strategy"] == "mixed"
    assert labels[N + "mig-3g.47gb.count"] == "1"
    assert N + "gfd.timestamp" not in labels


def test_gfd_refuses_bad_flags(tmp_path: Path) -> None:
    base = ["--simulate", "t4-single", "--output-file", str(tmp_path / "f"), "--oneshot"]
    assert gfd_main([*base, "--sleep-interval", "soon"], {}) == 1
    assert gfd_main([*base, "--no-timestamp", "maybe"], {}) == 1
    assert not (tmp_path / "f").exists()


def test_gfd_use_node_feature_api_falls_back_to_the_file(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gfd"
    argv = ["--simulate", "t4-single", "-o", str(out), "--oneshot", "--use-node-feature-api"]
    assert gfd_main(argv, {}) == 0
    assert "--use-node-feature-api is not supported" in capfd.readouterr().err
    assert read_labels(out)[N + "gpu.count"] == "1"


def test_gfd_daemon_relabels_and_removes_its_file_on_sigterm(tmp_path: Path) -> None:
    out = tmp_path / "gfd"
    argv = ["-o", str(out), "--sleep-interval", "50ms", "--simulate", "dgx-h100", "--machine-type-file", ""]
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from nvidia_device_plugin.cli.gfd import main; "
         "sys.exit(main())", *argv],
        env={**os.environ, "GFD_SLEEP_INTERVAL": "1h"},
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: read_labels(out).get(N + "gpu.count") == "8", "the first pass")
        first = read_labels(out)[N + "gfd.timestamp"]
        wait_for(lambda: read_labels(out).get(N + "gfd.timestamp", first) != first, "a second pass", 15)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not out.exists()

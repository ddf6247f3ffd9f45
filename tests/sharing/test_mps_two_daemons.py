"""MPS end to end: `mps-control-daemon` (with the fake control binary) and the plugin, seen from kubelet.

The control daemon runs on the same simulated node as the plugin and writes readiness under a temporary
MPS root; the plugin serves the kubelet stand-in over real unix sockets and reads that readiness.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pynvml
import pytest

from nvidia_device_plugin.config.loader import parse_config_text
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.daemons.mps_control import MpsControlDaemon
from nvidia_device_plugin.daemons.run import Daemon
from nvidia_device_plugin.sharing import mps_daemon
from nvidia_device_plugin.sharing.readiness import read_status, status_path
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.checks import assert_all
from support.daemon_support import GPU, start_daemon
from support.fake_mps import install_fake_control, kill_fake_daemons, lines, started_control_daemon
from support.waiting import scaled, wait_for

NODE = "pcie-nvlink-pairs"  # 4 GPUs


class Setup:
    """One node's MPS root, config and fake control binary; the config can be changed by a test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mps_root = root / "mps"
        self.control = install_fake_control(root)
        self.sharing = "mps"
        self.replicas = 2

    def config(self) -> Config:
        text = (
            f"version: v1\nflags:\n  mpsRoot: {self.mps_root}\nsharing:\n"
            f"  {'mps' if self.sharing == 'mps' else 'timeSlicing'}:\n"
            f"    resources:\n    - name: {GPU}\n      replicas: {self.replicas}\n"
        )
        return parse_config_text(text)

    def control_daemon(self, control_path: str | None = None, **options: Any) -> MpsControlDaemon:
        return started_control_daemon(self.config, NODE, control_path or self.control, **options)

    def plugin(self, plugin_dir: Path) -> Daemon:
        return start_daemon(plugin_dir, NODE, self.config, mps_poll_interval_s=0.02)

    def pipe(self, gpu_uuid: str) -> Path:
        return self.mps_root / GPU / gpu_uuid / "pipe"

    def status_ready(self, gpu_uuid: str) -> bool:
        return read_status(status_path(str(self.mps_root), GPU, gpu_uuid)).ready


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    yield Setup(tmp_path)
    kill_fake_daemons(tmp_path)


def _gpus(control: MpsControlDaemon) -> list[str]:
    assert control.snapshot is not None
    return [g.uuid for g in sorted(control.snapshot.inventory.gpus, key=lambda g: g.index)]


def _health(kubelet: KubeletStandIn) -> dict[str, str]:
    return {device_id: d.health for device_id, d in kubelet.devices(GPU).items()}


def _all(kubelet: KubeletStandIn, health: str, gpus: list[str] | None = None) -> bool:
    devices = _health(kubelet)
    chosen = [h for i, h in devices.items() if gpus is None or i.split("::")[0] in gpus]
    return bool(chosen) and all(h == health for h in chosen)


def test_a_missing_control_binary_leaves_replicas_unhealthy_and_allocate_refused(
    setup: Setup, plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    missing = str(setup.root / "no-such-nvidia-cuda-mps-control")
    control = setup.control_daemon(control_path=missing)
    plugin = setup.plugin(plugin_dir)
    try:
        gpus = _gpus(control)
        wait_for(lambda: all(os.path.exists(setup.pipe(g).parent / "status.json") for g in gpus), "status")
        assert kubelet.wait_for_resources([GPU])
        assert kubelet.wait_for(lambda: _all(kubelet, "Unhealthy"))
        assert len(_health(kubelet)) == 8
        refusals: list[grpc.RpcError] = []

        def refused_naming_the_binary() -> bool:
            # The first status says "not started yet"; the one naming the missing binary follows it, and
            # the plugin reads it at its next poll.
            try:
                kubelet.allocate(GPU, [[f"{gpus[0]}::0"]])
            except grpc.RpcError as exc:
                refusals.append(exc)
                return missing in str(exc.details())
            raise AssertionError("allocated a replica whose MPS control daemon is not ready")

        assert kubelet.wait_for(refused_naming_the_binary)
        assert_all(refusals, lambda r: r.code() == grpc.StatusCode.INVALID_ARGUMENT)
        assert f"MPS control daemon of GPU 0 ({gpus[0]}) is not ready" in str(refusals[-1].details())
    finally:
        plugin.stop()
        control.stop()


def test_daemon_dies_then_comes_back_and_the_replicas_follow(
    setup: Setup, plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    control = setup.control_daemon()
    gpus = _gpus(control)
    wait_for(lambda: all(setup.status_ready(g) for g in gpus), "every GPU's daemon ready")
    plugin = setup.plugin(plugin_dir)
    try:
        assert kubelet.wait_for_resources([GPU])
        assert kubelet.wait_for(lambda: _all(kubelet, "Healthy"))
        _, response = kubelet.admit(GPU, 1)
        assert response.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"

        (setup.root / "refuse-start").touch()  # the restart fails until the test lets it succeed
        pid = mps_daemon.running_pid(str(setup.pipe(gpus[1])))
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert kubelet.wait_for(lambda: _all(kubelet, "Unhealthy", [gpus[1]]))
        assert _all(kubelet, "Healthy", [gpus[0], gpus[2], gpus[3]])
        with pytest.raises(grpc.RpcError, match="is not ready"):
            kubelet.allocate(GPU, [[f"{gpus[1]}::1"]])

        (setup.root / "refuse-start").unlink()
        assert kubelet.wait_for(lambda: _all(kubelet, "Healthy"))
        assert len(lines(setup.pipe(gpus[1]) / "launches")) == 2
        assert kubelet.allocate(GPU, [[f"{gpus[1]}::1"]]).container_responses[0].envs
        text = plugin.metrics.render("text/plain")[0].decode()
        assert (
            f'nvidia_device_plugin_mps_readiness_changes_total{{gpu_uuid="{gpus[1]}",ready="false"}} 1.0'
            in text
        )
    finally:
        plugin.stop()
        control.stop()


def test_a_plugin_restart_leaves_the_control_daemons_and_clients_running(
    setup: Setup, plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    control = setup.control_daemon()
    gpus = _gpus(control)
    wait_for(lambda: all(setup.status_ready(g) for g in gpus), "every GPU's daemon ready")
    pids = [mps_daemon.running_pid(str(setup.pipe(g))) for g in gpus]
    try:
        first = setup.plugin(plugin_dir)
        assert kubelet.wait_for(lambda: _all(kubelet, "Healthy"))
        first.stop()
        second = setup.plugin(plugin_dir)
        try:
            assert kubelet.wait_for(lambda: _all(kubelet, "Healthy"))
        finally:
            second.stop()
        assert [mps_daemon.running_pid(str(setup.pipe(g))) for g in gpus] == pids
        for gpu in gpus:
            assert lines(setup.pipe(gpu) / "launches") == ["-d"]
            assert "quit" not in lines(setup.pipe(gpu) / "commands")
    finally:
        control.stop()


def test_a_control_daemon_restart_adopts_the_running_daemons(
    setup: Setup, plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    first = setup.control_daemon()
    gpus = _gpus(first)
    wait_for(lambda: all(setup.status_ready(g) for g in gpus), "every GPU's daemon ready")
    pids = [mps_daemon.running_pid(str(setup.pipe(g))) for g in gpus]
    plugin = setup.plugin(plugin_dir)
    try:
        assert kubelet.wait_for(lambda: _all(kubelet, "Healthy"))
        first.stop()
        assert_all(gpus, lambda g: setup.status_ready(g))  # clients keep running while it is away
        second = setup.control_daemon()
        try:
            wait_for(
                lambda: all(s is not None and s.ready for s in second.supervisor.statuses().values()),
                "the successor's first check",
            )
            assert [mps_daemon.running_pid(str(setup.pipe(g))) for g in gpus] == pids
            for gpu in gpus:
                assert lines(setup.pipe(gpu) / "launches") == ["-d"]
            assert _all(kubelet, "Healthy")
        finally:
            second.stop()
    finally:
        plugin.stop()


def test_config_changes_quit_control_daemons_only_when_no_longer_needed(
    setup: Setup, plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    control = setup.control_daemon()
    gpus = _gpus(control)
    wait_for(lambda: all(setup.status_ready(g) for g in gpus), "every GPU's daemon ready")
    assert control.nvml is not None
    nv = control.nvml.nv

    def modes() -> list[int]:
        return [nv.nvmlDeviceGetComputeMode(nv.nvmlDeviceGetHandleByUUID(g)) for g in gpus]

    assert modes() == [pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS] * 4
    pids = [mps_daemon.running_pid(str(setup.pipe(g))) for g in gpus]
    plugin = setup.plugin(plugin_dir)
    try:
        assert kubelet.wait_for(lambda: _all(kubelet, "Healthy"))

        setup.replicas = 4  # still MPS: the daemons stay, with new client defaults
        assert control.reload("test") and plugin.reload("test")
        wait_for(
            lambda: "set_default_active_thread_percentage 25" in lines(setup.pipe(gpus[0]) / "commands"),
            "the new defaults",
        )
        assert [mps_daemon.running_pid(str(setup.pipe(g))) for g in gpus] == pids
        assert kubelet.wait_for(lambda: len(_health(kubelet)) == 16 and _all(kubelet, "Healthy"))

        setup.sharing = "time-slicing"  # MPS no longer wanted: now, and only now, quit
        assert control.reload("test") and plugin.reload("test")
        for gpu in gpus:
            assert lines(setup.pipe(gpu) / "commands")[-1] == "quit"
            assert mps_daemon.running_pid(str(setup.pipe(gpu))) is None
            assert not (setup.pipe(gpu).parent / "status.json").exists()
        assert modes() == [pynvml.NVML_COMPUTEMODE_DEFAULT] * 4
        assert kubelet.wait_for(lambda: _all(kubelet, "Healthy"))  # time-sliced replicas need no daemon
        _, response = kubelet.admit(GPU, 1)
        assert "CUDA_MPS_PIPE_DIRECTORY" not in response.envs
    finally:
        plugin.stop()
        control.stop()


def test_the_command_leaves_its_daemons_running_on_sigterm(setup: Setup) -> None:
    config = setup.root / "config.yaml"
    config.write_text(
        f"version: v1\nflags:\n  mpsRoot: {setup.mps_root}\n"
        f"sharing:\n  mps:\n    resources:\n    - name: {GPU}\n      replicas: 2\n"
    )
    command = [sys.executable, "-m", "nvidia_device_plugin", "mps-control-daemon", "--simulate", "t4-single"]
    command += ["--config-file", str(config), "--mps-control-binary", setup.control]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: any(p.name == "status.json" for p in setup.mps_root.rglob("*")), "a status file")
        (status_file,) = setup.mps_root.rglob("status.json")
        wait_for(lambda: read_status(str(status_file)).ready, "the T4's daemon ready")
        pid = read_status(str(status_file)).pid
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=scaled(30))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output
    assert "compute mode set to EXCLUSIVE_PROCESS" in output
    assert "MPS control daemons are left running" in output
    assert pid is not None and mps_daemon.running_pid(str(status_file.parent / "pipe")) == pid
    assert read_status(str(status_file)).ready


def test_a_control_daemon_reload_that_nvml_fails_keeps_the_daemons_and_is_retried(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nvidia_device_plugin.daemons.follower")
    # The retries land 1.5 s after the reload: the look at the daemons' commands before them must come first.
    control = setup.control_daemon(reload_retry_min_s=0.5)
    try:
        gpus = _gpus(control)
        wait_for(lambda: all(setup.status_ready(g) for g in gpus), "every GPU's daemon ready")
        pids = [mps_daemon.running_pid(str(setup.pipe(g))) for g in gpus]
        assert control.nvml is not None and control.nvml.simulator is not None
        control.nvml.simulator.fail_next("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN, count=2)
        setup.replicas = 4
        assert not control.reload("test")
        assert "config reload (test) rejected, MPS daemons unchanged" in caplog.text
        assert "set_default_active_thread_percentage 25" not in lines(setup.pipe(gpus[0]) / "commands")
        wait_for(
            lambda: all(
                "set_default_active_thread_percentage 25" in lines(setup.pipe(g) / "commands") for g in gpus
            ),
            "the retried reload's client defaults",
        )
        assert [mps_daemon.running_pid(str(setup.pipe(g))) for g in gpus] == pids  # kept, never restarted
        assert "retrying the config reload in 0.5s" in caplog.text
        assert "retrying the config reload in 1s" in caplog.text
    finally:
        control.stop()


def test_a_gpu_lost_before_a_control_daemon_reload_keeps_its_mps_daemon(setup: Setup) -> None:
    control = setup.control_daemon()
    try:
        gpus = _gpus(control)
        wait_for(lambda: all(setup.status_ready(g) for g in gpus), "every GPU's daemon ready")
        pid = mps_daemon.running_pid(str(setup.pipe(gpus[3])))
        assert control.nvml is not None and control.nvml.simulator is not None
        control.nvml.simulator.set_lost(3, True)
        setup.replicas = 4
        assert control.reload("test"), "a lost GPU must not make the reload fail"
        assert control.snapshot is not None
        assert [g.uuid for g in control.snapshot.inventory.gpus if g.lost] == [gpus[3]]  # carried over
        assert "quit" not in lines(setup.pipe(gpus[3]) / "commands")
        assert mps_daemon.running_pid(str(setup.pipe(gpus[3]))) == pid
        assert (setup.pipe(gpus[3]).parent / "status.json").exists()
    finally:
        control.stop()

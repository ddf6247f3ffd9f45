"""MPS against what tenants and a broken control binary do: a deleted or replaced pid file, a `quit` that
hangs, a `-d` that fails with megabytes of output, and children that must take signals.

Seen as kubelet sees it (the plugin over the kubelet stand-in, reading the control daemon's status files)
or from outside a separate `mps-control-daemon` process.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from nvidia_device_plugin.config.loader import parse_config_text
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.daemons.mps_control import MpsControlDaemon
from nvidia_device_plugin.sharing import mps_daemon
from nvidia_device_plugin.sharing.readiness import GpuMpsStatus, read_status
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU, start_daemon
from support.fake_mps import install_fake_control, kill_fake_daemons, lines, started_control_daemon
from support.waiting import eventually, wait_for

NODE = "pcie-nvlink-pairs"  # 4 GPUs
GRACE_PERIOD_S = 30  # a pod's default terminationGracePeriodSeconds: kubelet SIGKILLs after it


def _config_text(mps_root: Path, sharing: str = "mps") -> str:
    return (
        f"version: v1\nflags:\n  mpsRoot: {mps_root}\nsharing:\n  {sharing}:\n"
        f"    resources:\n    - name: {GPU}\n      replicas: 2\n"
    )


class Node:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.mps_root = root / "mps"
        self.control = install_fake_control(root)

    def config(self) -> Config:
        return parse_config_text(_config_text(self.mps_root))

    def control_daemon(self) -> MpsControlDaemon:
        return started_control_daemon(self.config, NODE, self.control)

    def gpu_dir(self, gpu: str) -> Path:
        return self.mps_root / GPU / gpu

    def pid_file(self, gpu: str) -> Path:
        return self.gpu_dir(gpu) / "pipe" / mps_daemon.PID_FILE

    def status(self, gpu: str) -> GpuMpsStatus:
        return read_status(str(self.gpu_dir(gpu) / "status.json"))

    def command(self, config: Path, node: str = NODE, *more: str) -> list[str]:
        return [
            *(sys.executable, "-m", "nvidia_device_plugin", "mps-control-daemon", "--simulate", node),
            *("--config-file", str(config), "--mps-control-binary", self.control, *more),
        ]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    made = Node(tmp_path)
    yield made
    for fifo in tmp_path.rglob("*.pid"):  # a FIFO a blocked reader may still wait on (unfixed code)
        if fifo.is_fifo():
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    kill_fake_daemons(tmp_path)


def _gpus(control: MpsControlDaemon) -> list[str]:
    assert control.snapshot is not None
    return [g.uuid for g in sorted(control.snapshot.inventory.gpus, key=lambda g: g.index)]


def _all_healthy(kubelet: KubeletStandIn) -> bool:
    devices = kubelet.devices(GPU)
    return bool(devices) and all(d.health == "Healthy" for d in devices.values())


def _stop(proc: subprocess.Popen[str], timeout: float) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return output


# ---- item 10: readiness never rests on a file a tenant can delete ------------------------------------


@pytest.mark.parametrize("tamper", ["deleted", "fifo"])
def test_a_tenant_removing_its_pid_file_leaves_every_replica_healthy(
    node: Node, plugin_dir: Path, kubelet: KubeletStandIn, tamper: str
) -> None:
    control = node.control_daemon()
    gpus = _gpus(control)
    wait_for(lambda: all(node.status(g).ready for g in gpus), "every GPU's daemon ready")
    plugin = start_daemon(plugin_dir, NODE, node.config, mps_poll_interval_s=0.02)
    try:
        assert kubelet.wait_for(lambda: _all_healthy(kubelet))
        pid = mps_daemon.running_pid(str(node.pid_file(gpus[1]).parent))
        node.pid_file(gpus[1]).unlink()  # what any tenant can do in its read-write pipe mount
        if tamper == "fifo":
            os.mkfifo(node.pid_file(gpus[1]))
        wait_for(
            lambda: (
                not node.pid_file(gpus[1]).is_fifo()
                and mps_daemon.running_pid(str(node.pid_file(gpus[1]).parent)) == pid
            ),
            "the pid file restored for the daemon that still runs",
        )
        # The other GPUs are still supervised: a daemon that dies is restarted.
        other = mps_daemon.running_pid(str(node.pid_file(gpus[2]).parent))
        assert other is not None
        os.kill(other, signal.SIGKILL)
        wait_for(lambda: len(lines(node.gpu_dir(gpus[2]) / "pipe" / "launches")) == 2, "GPU 2 restarted")
        assert lines(node.gpu_dir(gpus[1]) / "pipe" / "launches") == ["-d"]
        assert node.status(gpus[1]).ready and node.status(gpus[1]).pid == pid
        assert kubelet.wait_for(lambda: _all_healthy(kubelet))
        text = plugin.metrics.render("text/plain")[0].decode()
        assert f'mps_readiness_changes_total{{gpu_uuid="{gpus[1]}",ready="false"}}' not in text
    finally:
        plugin.stop()
        control.stop()


def test_a_successor_adopts_a_daemon_whose_pid_file_a_tenant_deleted(node: Node) -> None:
    first = node.control_daemon()
    gpus = _gpus(first)
    wait_for(lambda: all(node.status(g).ready for g in gpus), "every GPU's daemon ready")
    pid = node.status(gpus[0]).pid
    first.stop()
    node.pid_file(gpus[0]).unlink()
    second = node.control_daemon()
    try:
        wait_for(
            lambda: all(s is not None and s.ready for s in second.supervisor.statuses().values()),
            "the successor's daemons ready",
        )
        assert lines(node.gpu_dir(gpus[0]) / "pipe" / "launches") == ["-d"]
        assert node.status(gpus[0]).pid == pid
        assert mps_daemon.running_pid(str(node.pid_file(gpus[0]).parent)) == pid
    finally:
        second.stop()


# ---- item 11: the quit wait and the output published are bounded ------------------------------------


def test_the_command_stops_within_the_grace_period_while_every_quit_hangs(node: Node) -> None:
    config = node.root / "config.yaml"
    config.write_text(_config_text(node.mps_root))
    command = node.command(config, NODE, "--mps-quit-timeout", "1")  # the default, 10s, takes as long
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: len(list(node.mps_root.rglob("status.json"))) == 4, "four status files")
        wait_for(lambda: all(read_status(str(p)).ready for p in node.mps_root.rglob("status.json")), "ready")
        (node.root / "hang-quit").touch()
        config.write_text(_config_text(node.mps_root, "timeSlicing"))  # MPS no longer wanted: quit
        proc.send_signal(signal.SIGHUP)  # as config-manager signals a changed config
        wait_for(lambda: any("quit" in lines(p) for p in node.mps_root.rglob("commands")), "a quit sent")
        output = _stop(proc, timeout=GRACE_PERIOD_S - 5)  # what kubelet allows before SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output
    assert output.count("did not take 'quit' (no answer within 1s)") == 4, output  # all at once
    assert "mps-control-daemon stopped" in output


def test_a_failing_start_with_megabytes_of_output_publishes_a_bounded_reason(
    node: Node, plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    (node.root / "big-output").touch()
    control = node.control_daemon()
    plugin = start_daemon(plugin_dir, NODE, node.config, mps_poll_interval_s=0.02)
    try:
        gpus = _gpus(control)
        status_file = node.gpu_dir(gpus[0]) / "status.json"
        wait_for(lambda: "failing loudly" in node.status(gpus[0]).reason, "the failure published")
        assert status_file.stat().st_size < 8 * 1024
        assert "more" in node.status(gpus[0]).reason
        assert kubelet.wait_for_resources([GPU])
        refusals: list[str] = []

        def refused_naming_the_failure() -> bool:  # once the plugin has read the failure published
            with pytest.raises(grpc.RpcError) as refused:
                kubelet.allocate(GPU, [[f"{gpus[0]}::0"]])
            refusals.append(str(refused.value.details()))
            return "failing loudly" in refusals[-1]

        assert kubelet.wait_for(refused_naming_the_failure)
        assert len(refusals[-1]) < 8 * 1024
    finally:
        plugin.stop()
        control.stop()


# ---- item 12: every child starts with a clean signal mask --------------------------------------------


# SIGHUP, SIGINT, SIGTERM: what the command blocks in its own threads (0x4003 in /proc/<pid>/status).
HANDLED_BITS = sum(1 << (int(s) - 1) for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM))


def _blocked(pid: int) -> int:
    """The handled signals `pid` blocks (bash itself blocks SIGCHLD around its children: not ours)."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^SigBlk:\s*([0-9a-f]+)$", status, re.MULTILINE)
    assert match is not None, status
    return int(match[1], 16) & HANDLED_BITS


def test_the_daemons_it_starts_take_sigterm(node: Node) -> None:
    config = node.root / "config.yaml"
    config.write_text(_config_text(node.mps_root))
    proc = subprocess.Popen(
        node.command(config, "t4-single"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for(lambda: any(node.mps_root.rglob("status.json")), "a status file")
        (status_file,) = node.mps_root.rglob("status.json")
        wait_for(lambda: read_status(str(status_file)).ready, "the T4's daemon ready")
        pid = read_status(str(status_file)).pid
        assert pid is not None
        signals = dict(line.split(":") for line in lines(status_file.parent / "fake-signals"))
        assert int(signals["SigBlk"], 16) & HANDLED_BITS == 0, signals  # the control binary itself
        assert _blocked(pid) == 0  # the daemon it forked
        os.kill(pid, signal.SIGTERM)
        assert eventually(lambda: mps_daemon.running_pid(str(status_file.parent / "pipe")) is None)
    finally:
        _stop(proc, timeout=GRACE_PERIOD_S - 5)

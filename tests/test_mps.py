"""MPS: client environment and mounts, daemon specs, and the supervisor against a fake control binary."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nvidia_device_plugin.api.v1beta1 import api_pb2
from nvidia_device_plugin.resources import AdvertisedDevice, ResourcePlan, replica_id
from nvidia_device_plugin.sharing import mps, mps_daemon
from nvidia_device_plugin.sharing.mps_daemon import MpsDaemonSupervisor, daemon_specs

GIB = 1024**3
GPU0 = "GPU-0a0a0a0a-0000-4000-8000-000000000000"
GPU1 = "GPU-1b1b1b1b-1111-4111-8111-111111111111"

# Stands in for nvidia-cuda-mps-control: `-d` records its argv and environment, starts a long sleep as
# "the daemon" and writes its pid file; without arguments it records the command read from stdin and
# carries out `quit`.
FAKE_CONTROL = """#!/bin/bash
set -u
pipe="$CUDA_MPS_PIPE_DIRECTORY"
if [ "${1:-}" = "-d" ]; then
  env > "$pipe/daemon.env"
  echo "$*" >> "$pipe/launches"
  sleep 600 </dev/null >/dev/null 2>&1 &
  echo $! >> "$pipe/started-pids"
  echo $! > "$pipe/nvidia-cuda-mps-control.pid"
  exit 0
fi
read -r command
echo "$command" >> "$pipe/commands"
if [ "$command" = "quit" ]; then
  kill "$(cat "$pipe/nvidia-cuda-mps-control.pid")"
fi
"""


def _replica(uuid: str, index: int, replica: int, memory: int = 80 * GIB) -> AdvertisedDevice:
    return AdvertisedDevice(replica_id(uuid, replica), "gpu", uuid, uuid, index, None, replica, 0, memory)


def _mps_plan(name: str = "nvidia.com/gpu", replicas: int = 4) -> ResourcePlan:
    devices = tuple(_replica(u, i, r) for i, u in enumerate((GPU0, GPU1)) for r in range(replicas))
    return ResourcePlan(name, devices, sharing="mps", replicas=replicas)


@pytest.fixture
def fake_control(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "nvidia-cuda-mps-control"
    path.write_text(FAKE_CONTROL)
    path.chmod(0o755)
    yield str(path)
    # Whatever a failing test left running: only the sleeps this fake started, by their ids.
    for pids in tmp_path.rglob("started-pids"):
        for pid in pids.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def _eventually(condition: Callable[[], bool], what: str, limit_s: float = 10.0) -> None:
    """Wait for `condition`; the limit only turns a hang into a failure, it measures nothing."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.01)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _supervisor(root: Path, control: str, plans: list[ResourcePlan] | None = None) -> MpsDaemonSupervisor:
    return MpsDaemonSupervisor(
        [_mps_plan()] if plans is None else plans,
        str(root),
        control_path=control,
        check_interval_s=0.01,
        start_timeout_s=5.0,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
    )


# ----------------------------------------------------------------------------------------------------
# Values


def test_client_envs_split_memory_and_threads_among_replicas() -> None:
    assert mps.client_envs("nvidia.com/gpu", 80 * GIB, 3) == {
        "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe",
        "CUDA_MPS_LOG_DIRECTORY": "/mps/nvidia.com/gpu/log",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=27306M",  # 81920 MiB / 3, rounded down
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "33",
    }


def test_thread_percentage_never_drops_to_zero() -> None:
    assert mps.active_thread_percentage(48) == 2
    assert mps.active_thread_percentage(200) == 1


def test_client_mounts_give_the_gpus_daemon_directories_and_shared_memory() -> None:
    assert mps.client_mounts("nvidia.com/gpu", GPU0, "/run/nvidia/mps") == [
        api_pb2.Mount(
            container_path="/mps/nvidia.com/gpu/pipe", host_path=f"/run/nvidia/mps/nvidia.com/gpu/{GPU0}/pipe"
        ),
        api_pb2.Mount(
            container_path="/mps/nvidia.com/gpu/log",
            host_path=f"/run/nvidia/mps/nvidia.com/gpu/{GPU0}/log",
            read_only=True,
        ),
        api_pb2.Mount(container_path="/dev/shm", host_path="/run/nvidia/mps/shm"),
    ]


def test_one_daemon_per_shared_gpu_with_its_own_limits() -> None:
    devices = (
        _replica(GPU0, 0, 0, memory=40 * GIB),
        _replica(GPU0, 0, 1, memory=40 * GIB),
        AdvertisedDevice(GPU1, "gpu", GPU1, GPU1, 1, None, None, 0, 80 * GIB),  # not shared
    )
    (spec,) = daemon_specs(ResourcePlan("nvidia.com/gpu", devices, sharing="mps", replicas=2), "/var/mps")
    assert spec.gpu_uuid == GPU0
    assert spec.env() == {
        "CUDA_VISIBLE_DEVICES": GPU0,
        "CUDA_MPS_PIPE_DIRECTORY": f"/var/mps/nvidia.com/gpu/{GPU0}/pipe",
        "CUDA_MPS_LOG_DIRECTORY": f"/var/mps/nvidia.com/gpu/{GPU0}/log",
    }
    assert spec.setup_commands() == (
        "set_default_device_pinned_mem_limit 0 20480M",
        "set_default_active_thread_percentage 50",
    )


def test_plans_not_shared_with_mps_get_no_daemons() -> None:
    time_sliced = ResourcePlan("nvidia.com/gpu", _mps_plan().devices, sharing="time-slicing", replicas=4)
    assert daemon_specs(time_sliced, "/var/mps") == ()


# ----------------------------------------------------------------------------------------------------
# Supervisor


def test_supervisor_starts_one_daemon_per_gpu_with_its_environment(tmp_path: Path, fake_control: str) -> None:
    supervisor = _supervisor(tmp_path / "mps", fake_control)
    supervisor.start()
    try:
        assert supervisor.wait_ready(10.0)
        for gpu in (GPU0, GPU1):
            pipe = tmp_path / "mps" / "nvidia.com/gpu" / gpu / "pipe"
            env = dict(line.split("=", 1) for line in _lines(pipe / "daemon.env") if "=" in line)
            assert env["CUDA_VISIBLE_DEVICES"] == gpu
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
            assert env["CUDA_MPS_LOG_DIRECTORY"] == str(pipe.parent / "log")
            assert (pipe.parent / "log").is_dir()
            assert _lines(pipe / "launches") == ["-d"]
            assert _lines(pipe / "commands") == [
                "set_default_device_pinned_mem_limit 0 20480M",
                "set_default_active_thread_percentage 25",
            ]
    finally:
        supervisor.stop()


def test_supervisor_restarts_a_daemon_that_died(tmp_path: Path, fake_control: str) -> None:
    supervisor = _supervisor(tmp_path, fake_control, [_mps_plan(replicas=2)])
    pipe = tmp_path / "nvidia.com/gpu" / GPU0 / "pipe"
    supervisor.start()
    try:
        assert supervisor.wait_ready(10.0)
        first = mps_daemon.running_pid(str(pipe))
        assert first is not None
        os.kill(first, signal.SIGKILL)
        _eventually(lambda: len(_lines(pipe / "launches")) == 2, "a second launch")
        _eventually(
            lambda: len(_lines(pipe / "commands")) == 4 and supervisor.ready(), "the restarted daemon"
        )
        second = mps_daemon.running_pid(str(pipe))
        assert second is not None and second != first
        assert _lines(pipe / "commands")[2:] == _lines(pipe / "commands")[:2]  # limits set again
        other = tmp_path / "nvidia.com/gpu" / GPU1 / "pipe"
        assert _lines(other / "launches") == ["-d"]  # the other GPU's daemon was left alone
    finally:
        supervisor.stop()


def test_stop_sends_quit_and_the_daemons_are_gone(tmp_path: Path, fake_control: str) -> None:
    supervisor = _supervisor(tmp_path, fake_control)
    supervisor.start()
    assert supervisor.wait_ready(10.0)
    pipes = [tmp_path / "nvidia.com/gpu" / gpu / "pipe" for gpu in (GPU0, GPU1)]
    pids = [mps_daemon.running_pid(str(p)) for p in pipes]
    supervisor.stop()
    for pipe, pid in zip(pipes, pids, strict=True):
        assert pid is not None
        assert _lines(pipe / "commands")[-1] == "quit"
        assert mps_daemon.running_pid(str(pipe)) is None
    assert not supervisor.ready()


def test_a_successor_adopts_running_daemons_instead_of_starting_more(
    tmp_path: Path, fake_control: str
) -> None:
    first = _supervisor(tmp_path, fake_control)
    first.start()
    assert first.wait_ready(10.0)
    first.stop(quit_daemons=False)
    pipe = tmp_path / "nvidia.com/gpu" / GPU0 / "pipe"
    pid = mps_daemon.running_pid(str(pipe))
    assert pid is not None

    second = _supervisor(tmp_path, fake_control)
    second.start()
    try:
        assert second.wait_ready(10.0)
        assert _lines(pipe / "launches") == ["-d"]
        assert mps_daemon.running_pid(str(pipe)) == pid
    finally:
        second.stop()


def test_simulated_node_starts_nothing_and_says_so_once(
    tmp_path: Path, fake_control: str, caplog: pytest.LogCaptureFixture
) -> None:
    supervisor = MpsDaemonSupervisor(
        [_mps_plan()], str(tmp_path / "mps"), control_path=fake_control, simulated=True
    )
    with caplog.at_level(logging.INFO, logger="nvidia_device_plugin.sharing.mps_daemon"):
        supervisor.start()
        supervisor.stop()
    assert [r.getMessage() for r in caplog.records] == ["MPS control daemon not started: simulated node"]
    assert supervisor.ready()
    assert not (tmp_path / "mps").exists()


def test_a_missing_control_binary_is_reported_and_never_ready(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    supervisor = _supervisor(tmp_path, str(tmp_path / "no-such-binary"), [_mps_plan(replicas=2)])
    with caplog.at_level(logging.INFO, logger="nvidia_device_plugin.sharing.mps_daemon"):
        supervisor.start()
        _eventually(
            lambda: any("failed to start" in r.getMessage() for r in caplog.records), "the start failure"
        )
        assert not supervisor.ready()
        supervisor.stop()
    assert any(str(tmp_path / "no-such-binary") in r.getMessage() for r in caplog.records)

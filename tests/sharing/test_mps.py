"""MPS: client environment and mounts, daemon specs, and the supervisor against a fake control binary."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from nvidia_device_plugin.api.v1beta1 import api_pb2
from nvidia_device_plugin.base.errors import AllocationError, ConfigError
from nvidia_device_plugin.config.loader import parse_config_text
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.health.registry import UnhealthyIds
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.plans.resources import AdvertisedDevice, ResourcePlan, replica_id
from nvidia_device_plugin.serving.allocate import AllocationIndex, AllocationSettings, allocate
from nvidia_device_plugin.sharing import mps, mps_daemon
from nvidia_device_plugin.sharing.mps_daemon import MpsDaemonSupervisor, daemon_specs
from nvidia_device_plugin.sharing.readiness import read_status
from nvidia_device_plugin.snapshot import build_snapshot

from support.fake_mps import install_fake_control, kill_fake_daemons, lines
from support.waiting import wait_for

GIB = 1024**3
GPU0 = "GPU-0a0a0a0a-0000-4000-8000-000000000000"
GPU1 = "GPU-1b1b1b1b-1111-4111-8111-111111111111"


def _replica(uuid: str, index: int, replica: int, memory: int = 80 * GIB) -> AdvertisedDevice:
    return AdvertisedDevice(replica_id(uuid, replica), "gpu", uuid, uuid, index, None, replica, 0, memory)


def _mps_plan(name: str = "nvidia.com/gpu", replicas: int = 4) -> ResourcePlan:
    devices = tuple(_replica(u, i, r) for i, u in enumerate((GPU0, GPU1)) for r in range(replicas))
    return ResourcePlan(name, devices, sharing="mps", replicas=replicas)


def _allocate(plan: ResourcePlan, requests: list[list[str]]) -> api_pb2.AllocateResponse:
    """allocate() with the default settings, every device healthy (no device specs: no GPU facts read)."""
    index = AllocationIndex(plan, Inventory(gpus=()))
    return allocate(index, requests, AllocationSettings.from_config(Config()), UnhealthyIds(()))


@pytest.fixture
def fake_control(tmp_path: Path) -> Iterator[str]:
    yield install_fake_control(tmp_path)
    kill_fake_daemons(tmp_path)


def _supervisor(
    root: Path, control: str, plans: list[ResourcePlan] | None = None
) -> tuple[MpsDaemonSupervisor, list[mps_daemon.MpsDaemonSpec]]:
    supervisor = MpsDaemonSupervisor(
        control_path=control,
        check_interval_s=0.01,
        start_timeout_s=5.0,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
    )
    specs = [s for plan in ([_mps_plan()] if plans is None else plans) for s in daemon_specs(plan, str(root))]
    supervisor.update(specs)
    return supervisor, specs


def _all_ready(specs: list[mps_daemon.MpsDaemonSpec]) -> bool:
    return all(read_status(s.status_path).ready for s in specs)


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


def test_a_gpu_whose_memory_is_unknown_gets_no_pinned_memory_limit() -> None:
    # As NVIDIA skips zero-memory devices: "0=0M" would leave the clients no device memory at all.
    envs = mps.client_envs("nvidia.com/gpu", 0, 4)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in envs
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    plan = ResourcePlan("nvidia.com/gpu", tuple(_replica(GPU0, 0, r, memory=0) for r in range(4)), "mps", 4)
    (spec,) = daemon_specs(plan, "/var/mps")
    assert spec.setup_commands() == ("set_default_active_thread_percentage 25",)


def test_plans_not_shared_with_mps_get_no_daemons() -> None:
    time_sliced = ResourcePlan("nvidia.com/gpu", _mps_plan().devices, sharing="time-slicing", replicas=4)
    assert daemon_specs(time_sliced, "/var/mps") == ()


def test_several_replicas_of_one_gpu_get_that_many_shares() -> None:
    envs = mps.client_envs("nvidia.com/gpu", 80 * GIB, 4, shares=3)
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=61440M"  # 3 x 20480 MiB
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "75"
    assert mps.active_thread_percentage(3, shares=3) == 99  # 3 x 33, the rounding of one share kept
    assert mps.active_thread_percentage(1, shares=2) == 100  # never more than the whole GPU


def test_allocate_scales_limits_with_replicas_when_requests_may_exceed_one() -> None:
    plan = _mps_plan(replicas=4)
    response = _allocate(plan, [[replica_id(GPU1, 0), replica_id(GPU1, 2)]])
    envs = response.container_responses[0].envs
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40960M"
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert envs["NVIDIA_VISIBLE_DEVICES"] == GPU1


def test_allocate_refuses_mps_replicas_of_two_gpus_in_one_container() -> None:
    with pytest.raises(AllocationError, match=rf"must be on one GPU .* spans GPU 0 \({GPU0}\), GPU 1"):
        _allocate(_mps_plan(), [[replica_id(GPU0, 0), replica_id(GPU1, 0)]])


def test_allocate_honours_fail_requests_greater_than_one_for_mps() -> None:
    plan = replace(_mps_plan(), fail_requests_greater_than_one=True)
    with pytest.raises(AllocationError, match="maximum request size for shared resources is 1"):
        _allocate(plan, [[replica_id(GPU0, 0), replica_id(GPU0, 1)]])


def test_preference_keeps_a_multi_replica_request_on_the_fullest_gpu_that_fits() -> None:
    plan = _mps_plan(replicas=4)
    available = [replica_id(GPU0, r) for r in range(4)] + [replica_id(GPU1, r) for r in (1, 3)]
    assert mps.single_gpu_preference(plan, available, [], 2) == [replica_id(GPU1, 1), replica_id(GPU1, 3)]
    assert mps.single_gpu_preference(plan, available, [], 3) == [replica_id(GPU0, r) for r in range(3)]
    assert mps.single_gpu_preference(plan, available, [replica_id(GPU0, 3)], 2) == [
        replica_id(GPU0, 3),
        replica_id(GPU0, 0),
    ]
    assert mps.single_gpu_preference(plan, available, [], 5) is None


def test_more_than_48_mps_replicas_per_gpu_is_refused_naming_the_gpu() -> None:
    text = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 49\n"
    session = open_nvml("t4-single")
    try:
        with pytest.raises(ConfigError, match=r"replicas is 49, but GPU 0 \(GPU-.*\) accepts at most 48 MPS"):
            build_snapshot(session, parse_config_text(text))
        build_snapshot(session, parse_config_text(text.replace("49", "48")))
    finally:
        session.close()


# ----------------------------------------------------------------------------------------------------
# Supervisor


def test_supervisor_starts_one_daemon_per_gpu_with_its_environment(tmp_path: Path, fake_control: str) -> None:
    supervisor, specs = _supervisor(tmp_path / "mps", fake_control)
    supervisor.start()
    try:
        wait_for(lambda: _all_ready(specs), "both daemons ready")
        for gpu in (GPU0, GPU1):
            pipe = tmp_path / "mps" / "nvidia.com/gpu" / gpu / "pipe"
            env = dict(line.split("=", 1) for line in lines(pipe / "daemon.env") if "=" in line)
            assert env["CUDA_VISIBLE_DEVICES"] == gpu
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
            assert env["CUDA_MPS_LOG_DIRECTORY"] == str(pipe.parent / "log")
            assert (pipe.parent / "log").is_dir()
            assert lines(pipe / "launches") == ["-d"]
            assert lines(pipe / "commands") == [
                "set_default_device_pinned_mem_limit 0 20480M",
                "set_default_active_thread_percentage 25",
            ]
            status = read_status(str(pipe.parent / "status.json"))
            assert status.ready and status.pid == mps_daemon.running_pid(str(pipe))
    finally:
        supervisor.stop()


def test_supervisor_restarts_a_daemon_that_died_and_says_so_meanwhile(
    tmp_path: Path, fake_control: str
) -> None:
    supervisor, specs = _supervisor(tmp_path, fake_control, [_mps_plan(replicas=2)])
    pipe = tmp_path / "nvidia.com/gpu" / GPU0 / "pipe"
    supervisor.start()
    try:
        wait_for(lambda: _all_ready(specs), "both daemons ready")
        first = mps_daemon.running_pid(str(pipe))
        assert first is not None
        (tmp_path / "refuse-start").touch()
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: not read_status(specs[0].status_path).ready, "GPU 0 not ready")
        assert (
            "exited" in read_status(specs[0].status_path).reason
            or "refusing" in read_status(specs[0].status_path).reason
        )
        (tmp_path / "refuse-start").unlink()
        wait_for(lambda: len(lines(pipe / "launches")) == 2, "a second launch")
        wait_for(lambda: _all_ready(specs), "the restarted daemon ready")
        second = mps_daemon.running_pid(str(pipe))
        assert second is not None and second != first
        assert lines(pipe / "commands")[2:] == lines(pipe / "commands")[:2]  # limits set again
        other = tmp_path / "nvidia.com/gpu" / GPU1 / "pipe"
        assert lines(other / "launches") == ["-d"]  # the other GPU's daemon was left alone
    finally:
        supervisor.stop()


def test_only_daemons_no_longer_wanted_get_quit(tmp_path: Path, fake_control: str) -> None:
    supervisor, specs = _supervisor(tmp_path, fake_control)
    supervisor.start()
    wait_for(lambda: _all_ready(specs), "both daemons ready")
    pipes = [tmp_path / "nvidia.com/gpu" / gpu / "pipe" for gpu in (GPU0, GPU1)]
    kept_pid = mps_daemon.running_pid(str(pipes[1]))
    supervisor.update([specs[1]])
    assert lines(pipes[0] / "commands")[-1] == "quit"
    assert mps_daemon.running_pid(str(pipes[0])) is None
    assert not (pipes[0].parent / "status.json").exists()
    assert "quit" not in lines(pipes[1] / "commands")
    supervisor.stop()
    assert mps_daemon.running_pid(str(pipes[1])) == kept_pid  # stop() quits nothing
    assert read_status(specs[1].status_path).ready


def test_a_pid_file_naming_no_possible_process_reads_as_no_daemon(tmp_path: Path) -> None:
    for text in ("not a pid", "0", "-1", str(2**31), str(2**64)):  # 2**31 and up: beyond pid_t
        (tmp_path / mps_daemon.PID_FILE).write_text(text)
        assert mps_daemon.running_pid(str(tmp_path)) is None


def test_a_successor_adopts_running_daemons_instead_of_starting_more(
    tmp_path: Path, fake_control: str
) -> None:
    first, specs = _supervisor(tmp_path, fake_control)
    first.start()
    wait_for(lambda: _all_ready(specs), "both daemons ready")
    first.stop()
    pipe = tmp_path / "nvidia.com/gpu" / GPU0 / "pipe"
    pid = mps_daemon.running_pid(str(pipe))
    assert pid is not None

    second, _ = _supervisor(tmp_path, fake_control)
    second.start()
    try:
        wait_for(lambda: all(s is not None and s.ready for s in second.statuses().values()), "adopted")
        assert lines(pipe / "launches") == ["-d"]
        assert mps_daemon.running_pid(str(pipe)) == pid
    finally:
        second.stop()


def test_a_missing_control_binary_is_reported_per_gpu_and_never_ready(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = str(tmp_path / "no-such-binary")
    supervisor, specs = _supervisor(tmp_path, missing, [_mps_plan(replicas=2)])
    with caplog.at_level(logging.INFO, logger="nvidia_device_plugin.sharing.mps_daemon"):
        supervisor.start()
        wait_for(lambda: all(os.path.exists(s.status_path) for s in specs), "both status files")
        supervisor.stop()
    for spec in specs:
        status = read_status(spec.status_path)
        assert not status.ready and missing in status.reason
    assert any(missing in r.getMessage() and GPU1 in r.getMessage() for r in caplog.records)


def test_a_status_file_that_cannot_be_written_is_retried_and_logged_once(
    tmp_path: Path, fake_control: str, caplog: pytest.LogCaptureFixture
) -> None:
    supervisor, specs = _supervisor(tmp_path, fake_control)
    blocked = Path(specs[0].status_path)
    blocked.mkdir(parents=True)  # a directory where GPU 0's status file goes: every write fails
    other = tmp_path / "nvidia.com/gpu" / GPU1 / "pipe"
    with caplog.at_level(logging.ERROR, logger="nvidia_device_plugin.sharing.mps_daemon"):
        supervisor.start()
        try:
            wait_for(lambda: read_status(specs[1].status_path).ready, "GPU 1's daemon ready")
            # GPU 1's daemon dies and comes back: checks go on meanwhile, each one retrying GPU 0's write.
            pid = mps_daemon.running_pid(str(other))
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: len(lines(other / "launches")) == 2, "GPU 1's second launch")
            wait_for(lambda: read_status(specs[1].status_path).ready, "GPU 1's daemon ready again")
            blocked.rmdir()
            wait_for(lambda: read_status(specs[0].status_path).ready, "GPU 0's status written at last")
        finally:
            supervisor.stop()
    failed = [r.getMessage() for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(failed) == 1 and GPU0 in failed[0], failed

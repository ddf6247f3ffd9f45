"""The daemon under cdi-cri / cdi-annotations, driven over the kubelet stand-in: every CDI name an Allocate
returns is defined by a spec the daemon wrote (read back from the spec directory, checked against the CDI
schema); reloads rewrite the specs; a node whose specs cannot be made serves nothing, and says why; a
CDI fault that passes is retried with backoff until the config lands (issue 23 item 4)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cdi_support import cdi_config, defined_names

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.cdi.model import CDI_VENDOR
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.daemons.run import Daemon, DaemonOptions
from nvidia_device_plugin.nvml.session import NvmlSession, open_nvml
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU, start_daemon
from support.markers import soak

GPU_SPEC = f"{CDI_VENDOR}-gpu.json"


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for daemon in started:
        daemon.stop()


def spec_dir(daemon: Daemon) -> Path:
    assert daemon.snapshot is not None and daemon.snapshot.cdi is not None
    return Path(daemon.snapshot.cdi.spec_dir)


def returned_names(response: pb.ContainerAllocateResponse) -> list[str]:
    names = [d.name for d in response.cdi_devices]
    for key, value in response.annotations.items():
        if key.startswith("cdi.k8s.io/"):
            names += value.split(",")
    return names


def allocate_each(kubelet: KubeletStandIn, resource: str) -> list[str]:
    names = []
    for device_id in sorted(kubelet.devices(resource)):
        names += returned_names(kubelet.allocate(resource, [[device_id]]).container_responses[0])
    return names


def test_every_name_allocate_returns_for_gpus_and_replicas_is_defined(
    plugin_dir: Path, kubelet: KubeletStandIn, daemons: list[Daemon]
) -> None:
    config = cdi_config("cdi-cri", "cdi-annotations", replicas=4)
    daemons.append(start_daemon(plugin_dir, "dgx-a100", lambda: config))
    assert kubelet.wait_for_resources([GPU])
    names = allocate_each(kubelet, GPU)
    assert len(names) == 2 * 32  # each replica, once as a CRI CDI device and once in the annotation
    assert set(names) <= defined_names(spec_dir(daemons[0]))
    assert os.listdir(spec_dir(daemons[0])) == [GPU_SPEC]


def test_every_name_allocate_returns_for_mig_devices_by_index_is_defined(
    plugin_dir: Path, kubelet: KubeletStandIn, daemons: list[Daemon]
) -> None:
    config = cdi_config("cdi-cri", ids="index", mig="mixed")
    daemon = start_daemon(plugin_dir, "a100-mig-mixed", lambda: config)
    daemons.append(daemon)
    assert daemon.snapshot is not None
    resources = [p.name for p in daemon.snapshot.plans]
    assert kubelet.wait_for_resources(resources)
    names = [name for resource in resources for name in allocate_each(kubelet, resource)]
    assert f"{CDI_VENDOR}/gpu=0:0" in names and f"{CDI_VENDOR}/gpu=3" in names
    assert set(names) <= defined_names(spec_dir(daemon))


def test_a_reload_changing_the_mig_layout_and_id_strategy_rewrites_the_specs(
    plugin_dir: Path, kubelet: KubeletStandIn, daemons: list[Daemon]
) -> None:
    configs = [cdi_config("cdi-cri")]
    daemon = start_daemon(plugin_dir, "a100-mig-mixed", lambda: configs[-1])
    daemons.append(daemon)
    directory = spec_dir(daemon)
    before = defined_names(directory)
    (directory / f"{CDI_VENDOR}-mig.json").write_text("{}")  # a stale spec of ours
    assert daemon.snapshot is not None
    gpu_uuids = {g.uuid for g in daemon.snapshot.inventory.gpus}
    assert before == {f"{CDI_VENDOR}/gpu={u}" for u in gpu_uuids}

    configs.append(cdi_config("cdi-cri", ids="index", mig="mixed"))
    assert daemon.reload("test")
    after = defined_names(directory)
    assert os.listdir(directory) == [GPU_SPEC]
    assert not before & after  # no name of the old layout is left (no admitted container holds one)
    assert daemon.snapshot is not None
    resources = [p.name for p in daemon.snapshot.plans]
    assert kubelet.wait_for_resources(resources)
    assert set(name for r in resources for name in allocate_each(kubelet, r)) <= after

    configs.append(Config())  # no CDI strategy: our specs are not needed any more
    assert daemon.reload("test")
    assert os.listdir(directory) == []


def _session_without_driver_root(hide: Callable[[Path], None]) -> NvmlSession:
    session = open_nvml("t4-single")
    assert session.host.driver_root is not None
    hide(session.host.driver_root)
    return session


def test_a_missing_driver_root_refuses_the_cdi_resource_with_the_reason(
    plugin_dir: Path, kubelet: KubeletStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    moved: list[Path] = []

    def hide(root: Path) -> None:
        moved.append(root.rename(root.with_name("elsewhere")))

    session = _session_without_driver_root(hide)
    daemon = Daemon(DaemonOptions(plugin_dir, lambda: cdi_config("cdi-cri"), lambda: session))
    with caplog.at_level(logging.ERROR, logger="nvidia_device_plugin"):
        daemon.start()
    try:
        assert daemon.manager.served() == set()
        readiness = daemon.readiness()
        assert readiness is not None and "does not exist" in readiness and "driver root" in readiness
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any("cannot generate the CDI spec" in e and "serving no resources" in e for e in errors)
        directory = spec_dir(daemon)
        assert not directory.exists() or os.listdir(directory) == []

        assert session.host.driver_root is not None
        moved[0].rename(session.host.driver_root)  # the driver root is mounted after all
        assert daemon.reload("test")
        assert kubelet.wait_for_resources([GPU])
        assert daemon.readiness() is None or "waiting for kubelet" in (daemon.readiness() or "")
        names = allocate_each(kubelet, GPU)
        assert names and set(names) <= defined_names(spec_dir(daemon))
    finally:
        daemon.stop()


# ---- issue 23 item 4: a passing CDI fault is retried with backoff, as an NVML one is ------------------


def _retries(caplog: pytest.LogCaptureFixture) -> int:
    return sum("retrying the config reload in" in r.getMessage() for r in caplog.records)


def _cdi_rejections(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if "rejected" in r.getMessage() and "CDI" in r.getMessage()
    ]


FAST_RETRIES = {"reload_retry_min_s": 0.02, "reload_retry_max_s": 0.08}  # DaemonOptions of these tests


@pytest.fixture
def retry_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The follower's log lines, retries included (logged at debug after the first)."""
    caplog.set_level(logging.DEBUG, logger="nvidia_device_plugin.daemons.follower")
    return caplog


def test_a_driver_root_briefly_unusable_during_a_reload_keeps_serving_and_the_reload_lands_by_itself(
    plugin_dir: Path, kubelet: KubeletStandIn, daemons: list[Daemon], retry_log: pytest.LogCaptureFixture
) -> None:
    configs = [cdi_config("cdi-cri")]
    daemon = start_daemon(plugin_dir, "dgx-a100", lambda: configs[-1], **FAST_RETRIES)
    daemons.append(daemon)
    assert kubelet.wait_for_resources([GPU])
    assert daemon.nvml is not None and daemon.nvml.host.driver_root is not None
    root = daemon.nvml.host.driver_root
    away = root.rename(root.with_name("driver-root-unmounted"))  # a driver container restarting, say

    configs.append(cdi_config("cdi-cri", replicas=2))
    assert not daemon.reload("test")
    assert len(kubelet.devices(GPU)) == 8  # the last good config and its specs keep serving
    readiness = daemon.readiness() or ""
    assert "driver root" in readiness and "retrying with backoff" in readiness
    assert kubelet.wait_for(lambda: _retries(retry_log) >= 3)  # retried, and still failing
    away.rename(root)  # the fault passes

    assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 16)  # no SIGHUP, no config change
    assert daemon.readiness() is None
    names = allocate_each(kubelet, GPU)
    assert names and set(names) <= defined_names(spec_dir(daemon))
    [rejected] = _cdi_rejections(retry_log)  # one line for the one reason, however many retries
    assert "the driver root" in rejected and "retrying with backoff" in rejected


def test_a_spec_directory_briefly_unusable_during_a_reload_keeps_serving_and_the_reload_lands_by_itself(
    plugin_dir: Path, kubelet: KubeletStandIn, daemons: list[Daemon], retry_log: pytest.LogCaptureFixture
) -> None:
    configs = [cdi_config("cdi-cri")]
    daemon = start_daemon(plugin_dir, "dgx-a100", lambda: configs[-1], **FAST_RETRIES)
    daemons.append(daemon)
    assert kubelet.wait_for_resources([GPU])
    directory = spec_dir(daemon)
    away = directory.rename(directory.with_name("cdi-away"))
    directory.write_text("")  # /var/run/cdi is not a directory for a while

    configs.append(cdi_config("cdi-cri", replicas=2))
    assert not daemon.reload("test")
    assert len(kubelet.devices(GPU)) == 8
    assert "cannot write the CDI spec" in (daemon.readiness() or "")
    assert kubelet.wait_for(lambda: _retries(retry_log) >= 3)
    directory.unlink()
    away.rename(directory)

    assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 16)
    names = allocate_each(kubelet, GPU)
    assert names and set(names) <= defined_names(directory)
    assert len(_cdi_rejections(retry_log)) == 1


def test_a_driver_root_mounted_after_start_is_served_without_a_sighup(
    plugin_dir: Path, kubelet: KubeletStandIn, retry_log: pytest.LogCaptureFixture
) -> None:
    moved: list[Path] = []
    session = _session_without_driver_root(lambda root: moved.append(root.rename(root.with_name("later"))))
    options = DaemonOptions(plugin_dir, lambda: cdi_config("cdi-cri"), lambda: session)
    options.reload_retry_min_s = FAST_RETRIES["reload_retry_min_s"]
    options.reload_retry_max_s = FAST_RETRIES["reload_retry_max_s"]
    daemon = Daemon(options)
    daemon.start()
    try:
        assert daemon.manager.served() == set()
        assert kubelet.wait_for(lambda: _retries(retry_log) >= 2)
        assert session.host.driver_root is not None
        moved[0].rename(session.host.driver_root)
        assert kubelet.wait_for_resources([GPU])  # the retry found it
        assert set(allocate_each(kubelet, GPU)) <= defined_names(spec_dir(daemon))
    finally:
        daemon.stop()


@pytest.mark.parametrize("cycles", [2, soak(200)])
def test_cdi_faults_during_reloads_never_leave_the_node_without_its_gpus(
    cycles: int,
    plugin_dir: Path,
    kubelet: KubeletStandIn,
    daemons: list[Daemon],
    retry_log: pytest.LogCaptureFixture,
) -> None:
    configs = [cdi_config("cdi-cri")]
    daemon = start_daemon(plugin_dir, "dgx-a100", lambda: configs[-1], **FAST_RETRIES)
    daemons.append(daemon)
    assert kubelet.wait_for_resources([GPU])
    assert daemon.nvml is not None and daemon.nvml.host.driver_root is not None
    root, directory = daemon.nvml.host.driver_root, spec_dir(daemon)
    served = 8
    for cycle in range(cycles):
        broken = root if cycle % 2 else directory  # alternately the driver root and the spec directory
        away = broken.rename(broken.with_name(f"{broken.name}-away"))
        if broken == directory:
            directory.write_text("")
        configs.append(cdi_config("cdi-cri", replicas=2 if served == 8 else 0))
        assert not daemon.reload(f"cycle {cycle}")
        assert len(kubelet.devices(GPU)) == served  # never fewer while the fault lasts
        if broken == directory:
            directory.unlink()
        away.rename(broken)
        served = 16 if served == 8 else 8
        assert kubelet.wait_for(lambda n=served: len(kubelet.devices(GPU)) == n), cycle
        assert set(allocate_each(kubelet, GPU)) <= defined_names(directory)

"""Every file the node can write is read bounded (boundedio.py): a FIFO, a device, a huge file or a symlink
out of its directory in the place of an MPS status file, a CDI spec, a sysfs or procfs entry never blocks
the daemon nor grows its memory; the reader says what it found instead.

FIFOs that a thread of the code under test may still be blocked on (only before the fix) are opened for
writing once at the end of each test, which releases such a reader.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from nvidia_device_plugin.base import boundedio
from nvidia_device_plugin.base.errors import AllocationError
from nvidia_device_plugin.config.loader import parse_config_text
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.configmanager.processes import find_processes
from nvidia_device_plugin.devnodes import mig_capability_device_node
from nvidia_device_plugin.labels.nfd import read_machine_type
from nvidia_device_plugin.nvml.pci import sysfs_pci_dir
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.nvml.sim.events import SimulatedEventFeeder
from nvidia_device_plugin.nvml.sim.node import load_node
from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml
from nvidia_device_plugin.sharing.readiness import GpuMpsStatus, status_path, write_status
from nvidia_device_plugin.snapshot import build_snapshot
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.checks import assert_all
from support.daemon_support import GPU, gpu_uuids, start_daemon
from support.waiting import wait_for

NODE = "pcie-nvlink-pairs"  # 4 GPUs
BIG = 64 * 1024 * 1024  # a sparse file: no disk, but far beyond every bound


@pytest.fixture
def fifos() -> Iterator[list[Path]]:
    made: list[Path] = []
    yield made
    for fifo in made:  # release a reader blocked in open() (only the unfixed code blocks there)
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def make_fifo(path: Path, fifos: list[Path]) -> Path:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    fifos.append(path)
    return path


def returns(call: Callable[[], object], what: str) -> object:
    """`call()` on a thread, its result or its exception: the test fails (instead of hanging) when it
    blocks."""
    result: list[object] = []
    raised: list[BaseException] = []

    def body() -> None:
        try:
            result.append(call())
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    wait_for(lambda: not thread.is_alive(), what)
    if raised:
        raise raised[0]
    return result[0] if result else None


# ---- the helper itself --------------------------------------------------------------------------------


def test_a_fifo_is_refused_without_blocking(tmp_path: Path, fifos: list[Path]) -> None:
    fifo = make_fifo(tmp_path / "status.json", fifos)
    with pytest.raises(boundedio.RefusedFile, match=r"is a named pipe \(FIFO\), not a regular file"):
        boundedio.read_bytes(fifo, 1024)


def test_a_device_is_refused_directly_and_through_a_symlink(tmp_path: Path) -> None:
    with pytest.raises(boundedio.RefusedFile, match="is a character device, not a regular file"):
        boundedio.read_bytes("/dev/zero", 1024, symlinks="any")
    (tmp_path / "spec.json").symlink_to("/dev/zero")
    with pytest.raises(boundedio.RefusedFile, match="is a symlink to /dev/zero, outside its directory"):
        boundedio.read_bytes(tmp_path / "spec.json", 1024)
    with pytest.raises(boundedio.RefusedFile, match="character device"):
        boundedio.read_bytes(tmp_path / "spec.json", 1024, symlinks="any")


def test_a_file_over_the_bound_is_refused_or_cut(tmp_path: Path) -> None:
    big = tmp_path / "big"
    with big.open("wb") as out:
        out.truncate(BIG)
    with pytest.raises(boundedio.RefusedFile, match="is larger than 4 KiB") as refused:
        boundedio.read_bytes(big, 4096)
    assert refused.value.errno == errno.EFBIG and refused.value.kind == "too-big"
    assert boundedio.read_bytes(big, 4096, truncate=True) == bytes(4096)
    exact = tmp_path / "exact"
    exact.write_bytes(b"x" * 4096)
    assert boundedio.read_bytes(exact, 4096) == b"x" * 4096


def test_symlinks_inside_the_directory_are_followed_as_configmaps_make_them(tmp_path: Path) -> None:
    data = tmp_path / "..2026_01_01"
    data.mkdir()
    (data / "config.yaml").write_text("version: v1\n")
    (tmp_path / "..data").symlink_to(data.name)
    (tmp_path / "config.yaml").symlink_to("..data/config.yaml")
    assert boundedio.read_text(tmp_path / "config.yaml", 1024) == "version: v1\n"
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "secret").write_text("not for us")
    (tmp_path / "pid").symlink_to(outside / "secret")
    with pytest.raises(boundedio.RefusedFile, match="outside its directory"):
        boundedio.read_text(tmp_path / "pid", 1024)
    assert boundedio.read_text(tmp_path / "pid", 1024, symlinks="any") == "not for us"


def test_a_path_through_linked_directories_reads_the_file_the_kernel_would(tmp_path: Path) -> None:
    # sysfs: bus/pci/devices/<id> is a link to the device's directory, read through the link.
    device = tmp_path / "devices" / "pci0000:00" / "0000:07:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text("1\n")
    (tmp_path / "bus").mkdir()
    (tmp_path / "bus" / "0000:07:00.0").symlink_to(device)
    assert boundedio.read_text(tmp_path / "bus" / "0000:07:00.0" / "numa_node", 64) == "1\n"
    # ".." after a link climbs from where the link leads, as open(2) does, not from the link's parent:
    # that file is outside the directory the path names, so it is refused unless any link may be followed.
    (tmp_path / "devices" / "pci0000:00" / "numa_node").write_text("physical\n")
    (tmp_path / "bus" / "numa_node").write_text("lexical\n")
    through = tmp_path / "bus" / "0000:07:00.0" / ".." / "numa_node"
    with pytest.raises(boundedio.RefusedFile, match="outside its directory"):
        boundedio.read_text(through, 64)
    assert boundedio.read_text(through, 64, symlinks="any") == "physical\n"


def test_a_missing_file_and_a_directory_say_so(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        boundedio.read_bytes(tmp_path / "absent", 1024)
    with pytest.raises(boundedio.RefusedFile, match="is a directory"):
        boundedio.read_bytes(tmp_path, 1024)


# ---- MPS readiness, as kubelet sees it ----------------------------------------------------------------


def _mps_config(mps_root: Path) -> Config:
    return parse_config_text(
        f"version: v1\nflags:\n  mpsRoot: {mps_root}\nsharing:\n  mps:\n"
        f"    resources:\n    - name: {GPU}\n      replicas: 2\n"
    )


def _health(kubelet: KubeletStandIn, gpu: str) -> set[str]:
    return {d.health for i, d in kubelet.devices(GPU).items() if i.startswith(gpu + "::")}


def _refusal(kubelet: KubeletStandIn, gpu: str) -> str:
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.allocate(GPU, [[f"{gpu}::0"]])
    return str(refused.value.details())


@pytest.mark.parametrize("kind", ["fifo", "symlink-out", "huge"])
def test_an_mps_status_file_that_is_no_regular_file_in_its_place_reads_as_not_ready(
    tmp_path: Path, plugin_dir: Path, kubelet: KubeletStandIn, fifos: list[Path], kind: str
) -> None:
    mps_root = tmp_path / "mps"
    with open_nvml(NODE) as session:
        gpus = [g.uuid for g in build_snapshot(session, _mps_config(mps_root)).inventory.gpus]
    for gpu in gpus:
        write_status(status_path(str(mps_root), GPU, gpu), GpuMpsStatus(True, "running", pid=1))
    bad = Path(status_path(str(mps_root), GPU, gpus[1]))
    bad.unlink()
    if kind == "fifo":
        make_fifo(bad, fifos)
        expected = "named pipe (FIFO), not a regular file"
    elif kind == "symlink-out":  # a ready status somewhere else: must not be taken for this GPU's
        elsewhere = tmp_path / "elsewhere.json"
        write_status(str(elsewhere), GpuMpsStatus(True, "running", pid=1))
        bad.symlink_to(elsewhere)
        expected = "outside its directory"
    else:
        with bad.open("wb") as out:
            out.truncate(BIG)
        expected = "is larger than 64 KiB"
    daemon = returns(
        lambda: start_daemon(plugin_dir, NODE, lambda: _mps_config(mps_root), mps_poll_interval_s=0.02),
        "the plugin to start",
    )
    assert daemon is not None
    try:
        assert kubelet.wait_for_resources([GPU])
        assert kubelet.wait_for(lambda: _health(kubelet, gpus[1]) == {"Unhealthy"})
        assert_all((gpus[0], gpus[2], gpus[3]), lambda g: _health(kubelet, g) == {"Healthy"})
        assert expected in _refusal(kubelet, gpus[1])
        assert returns(lambda: daemon.reload("test"), "a reload") is True  # type: ignore[attr-defined]
    finally:
        daemon.stop()  # type: ignore[attr-defined]


# ---- CDI specs and discovery's sysfs and procfs reads -------------------------------------------------


def test_a_fifo_in_place_of_the_cdi_spec_never_freezes_a_reload(
    plugin_dir: Path, kubelet: KubeletStandIn, fifos: list[Path]
) -> None:
    config = parse_config_text("version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\n")
    daemon = start_daemon(plugin_dir, NODE, lambda: config)
    try:
        assert kubelet.wait_for_resources([GPU])
        assert daemon.snapshot is not None and daemon.snapshot.cdi is not None
        (spec,) = Path(daemon.snapshot.cdi.spec_dir).iterdir()
        make_fifo(spec, fifos)
        assert returns(lambda: daemon.reload("test"), "a reload with a FIFO as the CDI spec") is True
        assert spec.is_file() and not spec.is_fifo()  # rewritten in its place
        assert kubelet.allocate(GPU, [[gpu_uuids(daemon)[0]]]).container_responses[0].cdi_devices
    finally:
        daemon.stop()


def test_fifos_in_sysfs_and_procfs_never_freeze_discovery(fifos: list[Path]) -> None:
    with open_nvml("a100-mig-mixed") as session:
        first = build_snapshot(session, Config()).inventory
        gpu = first.gpus[0]
        device = sysfs_pci_dir(gpu.pci_bus_id, session.host.sysfs_root)
        assert device is not None
        for name in ("numa_node", "class"):
            make_fifo(device / name, fifos)
        assert session.host.proc_root is not None
        make_fifo(session.host.proc_root / "driver/nvidia-caps/mig-minors", fifos)
        again = returns(lambda: build_snapshot(session, Config()).inventory, "discovery")
        assert again is not None
        assert [g.uuid for g in again.gpus] == [g.uuid for g in first.gpus]  # type: ignore[attr-defined]


def test_the_other_readers_of_node_files_never_block_on_a_fifo(tmp_path: Path, fifos: list[Path]) -> None:
    fifo = make_fifo(tmp_path / "product_name", fifos)
    assert returns(lambda: read_machine_type(str(fifo)), "the machine type") == "unknown"
    with pytest.raises(AllocationError, match=r"named pipe \(FIFO\)"):
        returns(lambda: mig_capability_device_node(str(fifo)), "a MIG capability")
    (tmp_path / "proc" / "4242").mkdir(parents=True)
    make_fifo(tmp_path / "proc" / "4242" / "cmdline", fifos)
    assert returns(lambda: find_processes("nvidia-device-plugin", tmp_path / "proc"), "processes") == []
    feeder = SimulatedEventFeeder(make_fifo(tmp_path / "events.jsonl", fifos), SimulatedNvml(load_node(NODE)))
    with pytest.raises(OSError, match="not a regular file"):
        returns(feeder.poll, "the simulated events feed")

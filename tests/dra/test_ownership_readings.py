"""What one pod-resources reading tells the handover: which GPUs of this node its IDs hold (whatever the
resource name), whether a kubelet that just came back is believed yet, and how a failed reading breaks
"free on two readings in a row"."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nvidia_device_plugin.cli.dra import DEFAULT_KUBELET_RESTART_GRACE_S, dra_options
from nvidia_device_plugin.cli.main import build_parser
from nvidia_device_plugin.devices import Gpu, Inventory, MigDevice
from nvidia_device_plugin.dra.options import KUBELET_RESTART_GRACE_S
from nvidia_device_plugin.dra.ownership import DRA, Owners, Reading, gpus_held
from nvidia_device_plugin.dra.podresources import KubeletRestarting, PodResourcesError, PodResourcesReader

from support.podresources_standin import PodResourcesStandIn

GPU0, GPU1, GPU2 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111", "GPU-22222222"
MIG = "MIG-aaaaaaaa"


def _inventory() -> Inventory:
    mig = MigDevice(MIG, 0, GPU1, 0, "1g.10gb", 10 << 30, gpu_instance_id=1, compute_instance_id=0)
    return Inventory(
        (
            Gpu(0, GPU0, "NVIDIA A100-SXM4-80GB", 80 << 30, "00000000:07:00.0", 0, None, False, ()),
            Gpu(1, GPU1, "NVIDIA A100-SXM4-80GB", 80 << 30, "00000000:0F:00.0", 1, None, True, (mig,)),
            Gpu(2, GPU2, "NVIDIA A100-SXM4-80GB", 80 << 30, "00000000:47:00.0", 2, None, False, ()),
        )
    )


@pytest.mark.parametrize(
    ("resource", "device_id", "held"),
    [
        ("nvidia.com/gpu", GPU0, {GPU0}),
        ("nvidia.com/gpu.shared", f"{GPU2}::3", {GPU2}),  # a replica, under a renamed resource
        ("nvidia.com/mig-1g.10gb", MIG, {GPU1}),  # a MIG device holds its GPU
        ("nvidia.com/mig-1g.10gb", f"{MIG}::1", {GPU1}),
        ("nvidia.com/gpu", f"MIG-{GPU1}/1/0", {GPU1}),  # a legacy MIG name
        ("nvidia.com/gpu", "2", {GPU2}),  # the index strategy
        ("nvidia.com/gpu", "1:0", {GPU1}),
        ("nvidia.com/a100", "0::1", {GPU0}),
        ("example.com/nic", GPU0, {GPU0}),  # a UUID is ours whatever the name
        ("example.com/nic", "0", set()),  # another vendor's "0" is not our GPU 0
        ("nvidia.com/gpu", "7", set()),  # no GPU 7 here
        ("nvidia.com/gpu", "GPU-elsewhere", set()),
    ],
)
def test_an_id_holds_the_gpu_it_names_under_any_resource_name(
    resource: str, device_id: str, held: set[str]
) -> None:
    assert gpus_held({resource: {device_id}}, _inventory()) == held


def test_a_failed_reading_breaks_the_row_of_free_readings() -> None:
    owners = Owners()
    owners.want({GPU0: DRA})
    free = Reading(frozenset(), frozenset(), frozenset())
    assert owners.step(free) == []
    owners.interrupt()
    assert owners.step(free) == []  # one free reading before the failure and one after: not two in a row
    assert owners.step(free) == [GPU0]


class Clocks:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + 1.0e9  # the wall clock far from the monotonic one: only differences matter


def _reader(pods: PodResourcesStandIn, clocks: Clocks, grace_s: float = 30.0) -> PodResourcesReader:
    return PodResourcesReader(pods.socket, grace_s, clock=clocks.monotonic, wall_clock=clocks.wall)


def _set_age(socket: Path, clocks: Clocks, age_s: float) -> None:
    os.utime(socket, (clocks.wall() - age_s, clocks.wall() - age_s))


def test_a_socket_up_for_longer_than_the_grace_is_believed_at_once(plugin_dir: Path) -> None:
    clocks = Clocks()
    with PodResourcesStandIn(plugin_dir / "pr.sock") as pods:
        _set_age(pods.socket, clocks, 31.0)
        pods.plugin["a"] = ("nvidia.com/gpu", [GPU0])
        assert _reader(pods, clocks).read().plugin_ids == {"nvidia.com/gpu": frozenset({GPU0})}


def test_a_young_socket_is_believed_once_it_is_as_old_as_the_grace(plugin_dir: Path) -> None:
    clocks = Clocks()
    with PodResourcesStandIn(plugin_dir / "pr.sock") as pods:
        _set_age(pods.socket, clocks, 10.0)
        reader = _reader(pods, clocks)
        with pytest.raises(KubeletRestarting, match=r"answers count once it has answered for 30 s"):
            reader.read()
        clocks.now += 19.5
        with pytest.raises(KubeletRestarting):
            reader.read()
        clocks.now += 0.5
        reader.read()


def test_a_restarted_kubelet_and_one_that_failed_are_believed_only_after_the_grace(plugin_dir: Path) -> None:
    clocks = Clocks()
    with PodResourcesStandIn(plugin_dir / "pr.sock") as pods:
        _set_age(pods.socket, clocks, 3600.0)
        reader = _reader(pods, clocks)
        reader.read()
        pods.restart()  # a new socket, made now
        _set_age(pods.socket, clocks, 0.0)
        with pytest.raises(KubeletRestarting):
            reader.read()
        clocks.now += 30.0
        reader.read()
        pods.failing = True
        with pytest.raises(PodResourcesError, match="UNAVAILABLE"):
            reader.read()
        pods.failing = False
        clocks.now += 3600.0  # however long it failed, the grace starts when it answers again
        with pytest.raises(KubeletRestarting):
            reader.read()
        clocks.now += 30.0
        reader.read()


def test_a_missing_socket_is_named(plugin_dir: Path) -> None:
    reader = PodResourcesReader(plugin_dir / "absent.sock", 30.0)
    with pytest.raises(PodResourcesError, match=r"absent.sock does not exist \(mount"):
        reader.read()


def test_the_grace_flag_reaches_the_options_with_the_option_s_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert DEFAULT_KUBELET_RESTART_GRACE_S == KUBELET_RESTART_GRACE_S
    assert (
        dra_options(build_parser({}).parse_args(["run"])).kubelet_restart_grace_s == KUBELET_RESTART_GRACE_S
    )
    args = build_parser({"NVDP_DRA_KUBELET_RESTART_GRACE": "90"}).parse_args(["run"])
    assert dra_options(args).kubelet_restart_grace_s == 90.0
    args = build_parser({}).parse_args(["run", "--dra-kubelet-restart-grace", "600"])
    assert dra_options(args).kubelet_restart_grace_s == 600.0
    with pytest.raises(SystemExit):
        build_parser({}).parse_args(["run", "--dra-kubelet-restart-grace", "601"])
    assert "must be a number of seconds in (0, 600], got '601'" in capsys.readouterr().err

"""Dynamic MIG through the real sockets on a100-mig-dynamic (2 x A100-80GB in MIG mode, no MIG devices): a
claim allocated a placement gets its MIG device made at Prepare (its CDI spec names the new device's
capability nodes), destroyed at Unprepare, adopted across a restart of the plugin; failures are the claim's,
with NVML's reason, and leave nothing half made."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.cdi.model import CdiSettings
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.devices import Gpu, MigDevice
from nvidia_device_plugin.dra.kinds.mig import mig_device_name
from nvidia_device_plugin.dra.kubelet.checkpoint import Checkpoint, Entry, MigRecord
from nvidia_device_plugin.dra.kubelet.dynamic_mig import DynamicMig, NvmlMigControl, with_gpu
from nvidia_device_plugin.dra.kubelet.model import ClaimRef, NodeDevices
from nvidia_device_plugin.dra.kubelet.plugin import DraKubeletPlugin
from nvidia_device_plugin.dra.names import published_devices
from nvidia_device_plugin.dra.options import DraOptions
from nvidia_device_plugin.dra.side import DraSide
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.mig_manager import MigManager
from nvidia_device_plugin.nvml.session import NvmlSession, open_nvml
from nvidia_device_plugin.snapshot import build_snapshot

from support.dra_kubelet import DraKubeletStandIn, DraNode, resource_claim
from support.fake_apiserver import FakeApiServer
from support.waiting import wait_for

ONE_G, TWO_G = 19, 14  # NVIDIA's GI profile IDs of 1g.10gb and 2g.20gb on A100-80GB


def uid(n: int) -> str:
    return f"0f3c6b1e-{n:04d}-4a5e-9d7e-000000000000"


def claim(n: int) -> tuple[str, str, str]:
    return ("default", f"claim-{n}", uid(n))


class LiveNode:
    """The node as the daemon would serve it: its inventory, and each GPU read again after a MIG change."""

    def __init__(self, session: NvmlSession) -> None:
        self.session = session
        snapshot = build_snapshot(session, Config())
        self.inventory = snapshot.inventory
        self.cdi = CdiSettings.from_config(snapshot.config)
        self.rereads: list[str] = []

    def view(self) -> NodeDevices:
        return NodeDevices(
            published_devices(self.inventory, True), self.inventory, self.session.host, self.cdi
        )

    def gpu_changed(self, gpu: Gpu) -> None:
        self.rereads.append(gpu.uuid)
        self.inventory = with_gpu(self.inventory, gpu)

    def dynamic_mig(self) -> DynamicMig:
        return DynamicMig(NvmlMigControl(self.session), self.gpu_changed)

    def gpu(self, index: int) -> Gpu:
        return next(g for g in self.inventory.gpus if g.index == index)

    def migs(self, index: int = 0) -> tuple[MigDevice, ...]:
        """What the simulated driver holds now (read afresh, not from the inventory)."""
        return (
            discover(self.session.nv, self.session.host.sysfs_root, self.session.host.proc_root)
            .gpus[index]
            .mig_devices
        )


@dataclass
class Setup:
    dra: DraNode
    live: LiveNode
    kubelet: DraKubeletStandIn

    def plugin(self) -> DraKubeletPlugin:
        return self.dra.plugin(node=self.live.view, dynamic_mig=self.live.dynamic_mig())

    def placement(self, profile: str, gi_profile_id: int, start: int, gpu: int = 0) -> str:
        return mig_device_name(self.live.gpu(gpu), profile, gi_profile_id, start)

    def allocate(self, n: int, device: str) -> None:
        self.dra.api.claims.put(resource_claim(uid(n), name=f"claim-{n}", results=[("mig", device)]))

    def prepare(self, *ns: int) -> dict[str, Any]:
        return dict(self.kubelet.prepare([claim(n) for n in ns]))

    def unprepare(self, *ns: int) -> dict[str, str]:
        """Each claim's error ("" when unprepared), by UID."""
        return {u: a.error for u, a in self.kubelet.unprepare([claim(n) for n in ns]).items()}

    def checkpoint(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.dra.checkpoint.read_text())
        return document


def _setup(call_timeout_s: float | None = None) -> Iterator[Setup]:
    session = open_nvml(
        "a100-mig-dynamic", **({} if call_timeout_s is None else {"call_timeout_s": call_timeout_s})
    )
    root = Path(tempfile.mkdtemp(prefix="dmig-", dir="/tmp"))
    live = LiveNode(session)
    try:
        with FakeApiServer({}) as api:
            dra = DraNode(root, api, live.view())
            try:
                with DraKubeletStandIn(dra.registry_dir) as kubelet:
                    setup = Setup(dra, live, kubelet)
                    setup.plugin()
                    kubelet.driver()
                    yield setup
            finally:
                for plugin in dra.started:
                    plugin.stop()
    finally:
        if session.simulator is not None:
            session.simulator.release()
        session.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def node() -> Iterator[Setup]:
    yield from _setup()


def cap_nodes(mig: MigDevice) -> list[str]:
    assert mig.caps_minors is not None
    return [f"/dev/nvidia-caps/nvidia-cap{minor}" for minor in mig.caps_minors]


def test_seven_1g_claims_make_seven_instances_at_distinct_placements(node: Setup) -> None:
    for start in range(7):
        node.allocate(start, node.placement("1g.10gb", ONE_G, start))
    answers = node.prepare(*range(7))
    assert {u: a.error for u, a in answers.items()} == {uid(n): "" for n in range(7)}
    made = {m.placement: m for m in node.live.migs(0)}
    assert sorted(made) == [(start, 1) for start in range(7)]
    assert node.live.migs(1) == ()
    records = {u: e["migInstances"] for u, e in node.checkpoint()["claims"].items()}
    for start in range(7):
        mig = made[(start, 1)]
        [record] = records[uid(start)]
        assert (record["state"], record["migUUID"], record["giID"], record["ciID"]) == (
            "made",
            mig.uuid,
            mig.gpu_instance_id,
            mig.compute_instance_id,
        )
        assert (record["placementStart"], record["placementSize"], record["giProfileID"]) == (start, 1, ONE_G)
        [device] = node.dra.spec(uid(start))["devices"]  # schema-checked
        paths = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
        assert paths == ["/dev/nvidia0", *cap_nodes(mig)]
    # The inventory saw every instance: the placements are published with their UUIDs now.
    published = node.live.view().devices
    assert {published[node.placement("1g.10gb", ONE_G, s)].mig.uuid for s in range(7)} == {  # type: ignore[union-attr]
        m.uuid for m in made.values()
    }


def test_prepare_twice_answers_the_same_device_and_makes_nothing_more(node: Setup) -> None:
    device = node.placement("1g.10gb", ONE_G, 3)
    node.allocate(1, device)
    first = node.prepare(1)[uid(1)]
    before = node.live.migs()
    second = node.prepare(1)[uid(1)]
    assert first.error == second.error == ""
    assert list(second.devices[0].cdi_device_ids) == list(first.devices[0].cdi_device_ids)
    assert node.live.migs() == before and len(before) == 1


def test_unprepare_destroys_only_its_instance_and_frees_the_slices_for_a_larger_profile(node: Setup) -> None:
    for start in range(7):
        node.allocate(start, node.placement("1g.10gb", ONE_G, start))
    node.prepare(*range(7))
    assert node.unprepare(4, 5) == {uid(4): "", uid(5): ""}
    assert sorted(m.placement for m in node.live.migs()) == [(0, 1), (1, 1), (2, 1), (3, 1), (6, 1)]
    assert not (node.dra.spec_dir / f"k8s.gpu.nvidia.com-claim_{uid(4)}.json").exists()
    assert uid(4) not in node.checkpoint()["claims"]
    assert node.unprepare(4) == {uid(4): ""}  # a second unprepare is a no-op
    node.allocate(10, node.placement("2g.20gb", TWO_G, 4))
    assert node.prepare(10)[uid(10)].error == ""
    assert sorted(m.placement for m in node.live.migs()) == [(0, 1), (1, 1), (2, 1), (3, 1), (4, 2), (6, 1)]


def test_a_restarted_plugin_adopts_what_was_made_and_makes_nothing_twice(node: Setup) -> None:
    node.allocate(1, node.placement("1g.10gb", ONE_G, 6))
    node.allocate(2, node.placement("2g.20gb", TWO_G, 0))
    node.prepare(1, 2)
    made = node.live.migs()
    # A third claim's "creating" record whose instance was made (the daemon stopped before recording it),
    # and a fourth's whose instance never was.
    hand = MigManager(node.live.session.nv).create(0, ONE_G, 3)
    document = node.checkpoint()
    template = document["claims"][uid(1)]
    for n, start in ((3, 3), (4, 4)):
        record = {**template["migInstances"][0], "state": "creating", "giID": -1, "ciID": -1, "migUUID": ""}
        record.update(placementStart=start, device=node.placement("1g.10gb", ONE_G, start))
        document["claims"][uid(n)] = {**template, "name": f"claim-{n}", "state": "PrepareStarted"}
        document["claims"][uid(n)]["migInstances"] = [record]
        # Kubelet still has both: so does the API (a claim it lacks is unprepared at start).
        node.allocate(n, template["devices"][0]["device"])
    node.dra.started[-1].stop()
    node.dra.checkpoint.write_text(json.dumps(document))
    node.kubelet.restart()
    node.plugin()
    node.kubelet.driver()
    claims = node.checkpoint()["claims"]
    assert claims[uid(3)]["migInstances"][0]["migUUID"] == hand.uuid  # adopted as made
    assert "migInstances" not in claims[uid(4)]  # its instance was never made: the record is dropped
    answers = node.prepare(1, 2)
    assert [a.error for a in answers.values()] == ["", ""]
    assert sorted(m.uuid for m in node.live.migs()) == sorted([*(m.uuid for m in made), hand.uuid])
    assert node.unprepare(1, 2, 3, 4) == {uid(n): "" for n in (1, 2, 3, 4)}
    assert node.live.migs() == ()  # nothing leaked


def test_in_use_on_destroy_fails_that_claim_only_and_keeps_it_for_the_retry(node: Setup) -> None:
    node.allocate(1, node.placement("1g.10gb", ONE_G, 0))
    node.allocate(2, node.placement("1g.10gb", ONE_G, 1))
    node.prepare(1, 2)
    busy = next(m for m in node.live.migs() if m.placement == (0, 1))
    sim = node.live.session.simulator
    assert sim is not None
    sim.set_in_use(busy.uuid)
    errors = node.unprepare(1, 2)
    assert errors[uid(2)] == ""
    assert (
        "IN_USE" in errors[uid(1)]
        and busy.uuid in errors[uid(1)]
        and "claim default/claim-1" in errors[uid(1)]
    )
    assert [m.uuid for m in node.live.migs()] == [busy.uuid]
    assert node.dra.spec(uid(1))  # kept: the container may still run
    sim.set_in_use(busy.uuid, False)
    assert node.unprepare(1) == {uid(1): ""}
    assert node.live.migs() == ()


def test_a_placement_taken_by_a_hand_made_instance_fails_naming_it(node: Setup) -> None:
    node.allocate(1, node.placement("2g.20gb", TWO_G, 2))
    stale = node.live.view()  # the claim was allocated against slices from before the instance was made
    hand = MigManager(node.live.session.nv).create(0, ONE_G, 3)
    node.dra.started[-1].stop()
    node.dra.plugin(node=lambda: stale, dynamic_mig=node.live.dynamic_mig())
    node.kubelet.restart()
    node.kubelet.driver()
    error = node.prepare(1)[uid(1)].error
    assert "INSUFFICIENT_RESOURCES" in error and hand.uuid in error and "not made by this plugin" in error
    assert [m.uuid for m in node.live.migs()] == [hand.uuid]  # nothing half made
    assert uid(1) not in node.checkpoint()["claims"]


def test_without_mig_management_a_placement_claim_is_refused(node: Setup) -> None:
    node.dra.started[-1].stop()
    node.dra.plugin(node=node.live.view)
    node.kubelet.restart()
    node.kubelet.driver()
    node.allocate(1, node.placement("1g.10gb", ONE_G, 0))
    assert "does not make" in node.prepare(1)[uid(1)].error
    assert node.live.migs() == ()


@pytest.fixture
def slow_node() -> Iterator[Setup]:
    yield from _setup(call_timeout_s=1.0)


def test_a_hung_create_is_bounded_and_what_it_makes_later_is_destroyed_at_unprepare(slow_node: Setup) -> None:
    node = slow_node
    sim = node.live.session.simulator
    assert sim is not None
    node.allocate(1, node.placement("1g.10gb", ONE_G, 0))
    node.allocate(2, node.placement("1g.10gb", ONE_G, 0, gpu=1))
    sim.hang("nvmlDeviceCreateGpuInstanceWithPlacement", 0)
    answers = node.prepare(1, 2)
    assert "STUCK" in answers[uid(1)].error and "deadline" in answers[uid(1)].error
    assert answers[uid(2)].error == ""  # the other GPU is not held up
    [record] = node.checkpoint()["claims"][uid(1)]["migInstances"]
    assert record["state"] == "creating"  # kept: the driver may still make it
    sim.release()  # the hung create returns, and makes its instance after the claim was refused
    # Kubelet retries an unprepare that failed (here: while GPU 0's calls were still stuck).
    wait_for(lambda: node.unprepare(1, 2) == {uid(1): "", uid(2): ""}, "the claims to be unprepared")
    assert node.live.migs(0) == () and node.live.migs(1) == ()
    assert uid(1) not in node.checkpoint()["claims"]


class _ModeHolding:
    """The parts of a DraMode that DraSide.check reads: dynamic MIG on, and a claim holding a MIG device."""

    def __init__(self, plugin: DraKubeletPlugin) -> None:
        self.kubelet = plugin

    def dynamic_mig(self) -> bool:
        return True


def test_turning_dynamic_mig_off_with_mig_devices_in_use_is_refused_naming_the_claims(node: Setup) -> None:
    node.allocate(1, node.placement("1g.10gb", ONE_G, 0))
    node.prepare(1)
    [made] = node.live.migs()
    options = DraOptions(
        "gpu-node-1", node.dra.root / "pr.sock", node.dra.plugins_dir, node.dra.registry_dir, dict
    )
    side = DraSide(options, dict, lambda: None)
    side.mode = _ModeHolding(node.dra.started[-1])  # type: ignore[assignment]
    config = Config()
    on = replace(config, dra=replace(config.dra, enabled=True, dynamic_mig=True))
    snapshot = replace(build_snapshot(node.live.session, on), config=on)
    assert side.check(snapshot) is snapshot  # still on: served
    for off in (replace(on.dra, dynamic_mig=False), replace(on.dra, enabled=False)):
        with pytest.raises(ConfigError) as refused:
            side.check(replace(snapshot, config=replace(on, dra=off)))
        assert "claim default/claim-1" in str(refused.value) and made.uuid in str(refused.value)
    node.unprepare(1)
    off_snapshot = replace(snapshot, config=replace(on, dra=replace(on.dra, dynamic_mig=False)))
    assert side.check(off_snapshot) is off_snapshot  # nothing made any more: turned off


def test_mig_records_round_trip_through_the_checkpoint_and_a_malformed_one_sets_it_aside(
    tmp_path: Path,
) -> None:
    ref = ClaimRef("default", "claim-1", uid(1))
    made = MigRecord("gpu-0-mig-1g10gb-19-6", "GPU-a", 0, "1g.10gb", ONE_G, 6, 1, "made", 3, 0, "MIG-b")
    creating = replace(made, device="gpu-0-mig-1g10gb-19-5", start=5, state="creating", gi_id=-1, mig_uuid="")
    path = tmp_path / "checkpoint.json"
    Checkpoint(path, "boot", {uid(1): Entry(ref, "PrepareStarted", mig=(made, creating))}).save()
    loaded, _ = Checkpoint.load(path, "boot")
    assert loaded.get(uid(1)) == Entry(ref, "PrepareStarted", mig=(made, creating))
    document = json.loads(path.read_text())
    document["claims"][uid(1)]["migInstances"][0]["giID"] = "3"  # not an integer
    path.write_text(json.dumps(document))
    empty, _ = Checkpoint.load(path, "boot")
    assert list(empty) == [] and (tmp_path / "checkpoint.json.corrupt").exists()

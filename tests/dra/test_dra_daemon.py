"""The DRA mode end to end through a real daemon process (`python -m nvidia_device_plugin run --simulate
... --dra`), driven as a node drives it: kubelet's device-plugin side, its DRA plugin watcher and
Prepare/Unprepare calls, its pod-resources API, and one API server that serves ResourceClaims and records
ResourceSlices, all over real sockets. What a process adds over the in-process tests: the flags and the
environment reach the DRA side, the checkpoint and the slices survive a real SIGTERM and a new process,
and an XID from the `--simulate-events` file reaches the published slice."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nvidia_device_plugin.dra.kubelet.cdispec import claim_spec_file
from nvidia_device_plugin.nvml.sim.node import load_node
from nvidia_device_plugin.plans.resources import physical_uuid_of
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU
from support.dra_daemon import DraApiServer, daemon_output, start_dra_daemon, stop_daemon
from support.dra_kubelet import DraKubeletStandIn, resource_claim
from support.dra_rules import validate_objects
from support.fake_apiserver import NODE
from support.podresources_standin import PodResourcesStandIn
from support.waiting import wait_for

PRESET = "dgx-a100"
UUIDS = [g.uuid for g in sorted(load_node(PRESET).gpus, key=lambda g: g.index)]
UID = "0f3c6b1e-2222-4a5e-9d7e-000000000024"
CLAIM = ("default", "gpu-claim", UID)
HANDOVER_S = "0.02"  # pod-resources readings while a GPU moves (the stand-in answers at once)


@dataclass
class Node:
    """One test's node under the `plugin_dir` fixture's short /tmp path (a unix socket path holds at most
    107 bytes): the stand-ins, and the daemon processes started on it."""

    root: Path
    kubelet: KubeletStandIn
    dra: DraKubeletStandIn
    api: DraApiServer
    pods: PodResourcesStandIn
    processes: list[tuple[subprocess.Popen[str], Path]] = field(default_factory=list)

    @property
    def registration_socket(self) -> Path:
        return self.root / "plugins_registry" / "gpu.nvidia.com-reg.sock"

    @property
    def spec_dir(self) -> Path:
        return self.root / "cdi"

    def start(self, *flags: str) -> subprocess.Popen[str]:
        """`run` in a process of its own, with the DRA mode's paths under `root` and `flags` added."""
        log = self.root / f"daemon-{len(self.processes)}.log"
        process = start_dra_daemon(
            self.root, self.api, self.pods, log, PRESET, "--dra-handover-interval", HANDOVER_S, *flags
        )
        self.processes.append((process, log))
        return process

    def stop(self, process: subprocess.Popen[str]) -> str:
        return stop_daemon(self.processes, process)

    def output(self, process: subprocess.Popen[str]) -> str:
        return daemon_output(self.processes, process)

    def plugin_gpus(self) -> set[str]:
        """The GPUs the device plugin lists to kubelet now, through its current stream: none before that
        stream's first message (what kubelet kept of an earlier process does not count)."""
        if not self.kubelet.connected(GPU) or self.kubelet.plugin(GPU).updates == 0:
            return set()
        return {physical_uuid_of(i) for i in self.kubelet.devices(GPU)}

    def sliced(self) -> dict[str, str]:
        """Device name -> its GPU's UUID, over the slices the API server holds now."""
        return {n: d["attributes"]["uuid"]["string"] for n, d in self.api.devices().items()}

    def served(self, dra: set[int], plugin: set[int]) -> bool:
        """Whether DRA publishes exactly the GPUs `dra` (by index) and the device plugin lists `plugin`."""
        return self.sliced() == {f"gpu-{i}": UUIDS[i] for i in dra} and self.plugin_gpus() == {
            UUIDS[i] for i in plugin
        }

    def prepare(self, claim: tuple[str, str, str] = CLAIM) -> list[str]:
        """NodePrepareResources of `claim` through the daemon's socket: its CDI device IDs."""
        answer = self.dra.prepare([claim])[claim[2]]
        assert answer.error == "", answer.error
        return [i for d in answer.devices for i in d.cdi_device_ids]

    def unprepare(self, claim: tuple[str, str, str] = CLAIM) -> None:
        assert self.dra.unprepare([claim])[claim[2]].error == ""

    def checkpointed(self) -> dict[str, Any]:
        """The claims of the daemon's DRA checkpoint, as written."""
        path = self.root / "plugins" / "gpu.nvidia.com" / "checkpoint.json"
        claims: dict[str, Any] = json.loads(path.read_text())["claims"]
        return claims


@pytest.fixture
def node(plugin_dir: Path, kubelet: KubeletStandIn) -> Iterator[Node]:
    # The pod-resources socket in a directory of its own, as on a node: kubelet (the stand-in included)
    # clears the device-plugin directory of sockets it does not know when it starts.
    (plugin_dir / "pod-resources").mkdir()
    pods = PodResourcesStandIn(plugin_dir / "pod-resources" / "kubelet.sock")
    api = DraApiServer()
    with api, pods, DraKubeletStandIn(plugin_dir / "plugins_registry") as dra:
        setup = Node(plugin_dir, kubelet, dra, api, pods)
        try:
            yield setup
        finally:
            for process, log in setup.processes:
                if process.poll() is None:
                    process.kill()
                    process.wait(30)
                print(f"---- {log.name} (exit {process.returncode})\n{log.read_text()}")  # shown on failure


def test_the_daemon_registers_publishes_its_dra_gpus_and_prepares_claims_idempotently(node: Node) -> None:
    with node.pods.lock:  # a pod from before DRA was on holds GPU 1 through the device plugin
        node.pods.plugin["training"] = (GPU, [UUIDS[1]])
    process = node.start("--dra", "--dra-gpus", "0,1")
    driver = node.dra.current(node.registration_socket)
    assert (driver.info.type, driver.version) == ("DRAPlugin", "v1.DRAPlugin")
    assert driver.info.endpoint == str(node.root / "plugins" / "gpu.nvidia.com" / "dra.sock")
    assert driver.endpoint_served
    wait_for(lambda: node.served(dra={0}, plugin={2, 3, 4, 5, 6, 7}), "GPU 0 in DRA, 2-7 in ListAndWatch")
    readings = node.pods.calls
    wait_for(lambda: node.pods.calls >= readings + 4, "4 more pod-resources readings")
    assert node.served(dra={0}, plugin={2, 3, 4, 5, 6, 7})  # GPU 1 is held: served by neither side
    with node.pods.lock:
        del node.pods.plugin["training"]
    wait_for(lambda: node.served(dra={0, 1}, plugin={2, 3, 4, 5, 6, 7}), "GPU 1 in DRA once free")
    (only,) = node.api.current()
    assert only["spec"]["nodeName"] == NODE and only["spec"]["pool"]["name"] == NODE
    assert only["metadata"]["ownerReferences"][0]["uid"] == "node-uid-1"  # the Node's, read from the API
    validate_objects([only])

    node.api.claims.put(resource_claim(UID, results=[("gpu", "gpu-1")]))
    ids = node.prepare()
    assert ids == [f"k8s.gpu.nvidia.com/claim={UID}-gpu-1"]
    assert node.prepare() == ids  # the second time from the checkpoint, not the API
    assert node.api.claims.reads == [("default", "gpu-claim")]
    assert (node.spec_dir / claim_spec_file(UID)).exists()
    assert node.checkpointed()[UID]["state"] == "PrepareCompleted"
    node.unprepare()
    node.unprepare()  # unknown by now: succeeds with nothing to do
    assert not (node.spec_dir / claim_spec_file(UID)).exists() and node.checkpointed() == {}

    node.api.claims.put(resource_claim(UID, results=[("gpu", "gpu-5")]))  # a device-plugin GPU
    refused = node.dra.prepare([CLAIM])[UID].error
    assert "gpu-5" in refused, refused
    node.stop(process)
    assert not node.registration_socket.exists()


def test_a_restarted_daemon_answers_its_prepared_claim_from_the_checkpoint_and_keeps_its_slices(
    node: Node,
) -> None:
    node.api.claims.put(resource_claim(UID, results=[("gpu", "gpu-0")]))
    first = node.start("--dra", "--dra-gpus", "0,1")
    wait_for(lambda: node.served(dra={0, 1}, plugin={2, 3, 4, 5, 6, 7}), "the first daemon's handover")
    ids = node.prepare()
    slices = {name: s["metadata"]["uid"] for name, s in node.api.slices.items()}
    node.stop(first)
    node.api.claims.delete("default", "gpu-claim")  # from now on only the checkpoint knows the claim
    registrations, writes = len(node.dra.registrations), len(node.api.writes)

    second = node.start("--dra", "--dra-gpus", "0,1")
    node.dra.current(node.registration_socket)  # registered again, through the new process's socket
    assert len(node.dra.registrations) == registrations + 1
    assert node.prepare() == ids
    wait_for(lambda: node.served(dra={0, 1}, plugin={2, 3, 4, 5, 6, 7}), "the second daemon's handover")
    assert {name: s["metadata"]["uid"] for name, s in node.api.slices.items()} == slices
    assert [verb for verb, _ in node.api.writes[writes:]] == ["update"] * (len(node.api.writes) - writes)
    assert node.api.claims.reads == [("default", "gpu-claim")]
    node.unprepare()
    assert not (node.spec_dir / claim_spec_file(UID)).exists()
    node.stop(second)


def test_an_xid_from_the_events_file_taints_the_dra_device_and_recovery_lifts_it(node: Node) -> None:
    config = node.root / "config.yaml"
    # The grace is how long the taint stays: long enough for a busy machine's pauses.
    config.write_text("version: v1\nhealth:\n  recovery:\n    enabled: true\n    gracePeriod: 2\n")
    events = node.root / "events.jsonl"
    events.write_text("")
    process = node.start(
        "--dra", "--dra-gpus", "0,1", "--config-file", str(config), "--simulate-events", str(events)
    )

    def taints(device: str) -> list[dict[str, Any]]:
        return list(node.api.devices().get(device, {}).get("taints") or [])

    wait_for(lambda: node.served(dra={0, 1}, plugin={2, 3, 4, 5, 6, 7}), "the handover")
    assert taints("gpu-1") == []
    with events.open("a") as feed:
        feed.write(json.dumps({"gpu": 1, "xid": 79}) + "\n")
    wait_for(lambda: bool(taints("gpu-1")), "the XID taint on gpu-1")
    (taint,) = taints("gpu-1")
    assert (taint["key"], taint["value"], taint["effect"]) == ("gpu.nvidia.com/xid", "79", "NoSchedule")
    assert taints("gpu-0") == []
    validate_objects(node.api.current())
    wait_for(lambda: "gpu-1" in node.api.devices() and not taints("gpu-1"), "the taint to go on recovery")
    assert node.served(dra={0, 1}, plugin={2, 3, 4, 5, 6, 7})
    output = node.stop(process)
    assert "XID 79" in output, output

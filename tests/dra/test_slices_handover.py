"""The whole daemon in the DRA mode on a simulated node, with kubelet's device-plugin side, its
pod-resources API and an API server recording ResourceSlices, all over real sockets: one owner per GPU,
a GPU that changes sides only once it is free, ownership flipped under load without a GPU ever being
served by both sides, and XID taints that come and go with health."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nvidia_device_plugin.config.dra import Dra
from nvidia_device_plugin.config.v1 import Config, Recovery, ReplicatedResource, ReplicatedResources, Sharing
from nvidia_device_plugin.config.v1 import Health as HealthConfig
from nvidia_device_plugin.configmanager.nodewatch import api_client_for
from nvidia_device_plugin.daemons.run import Daemon
from nvidia_device_plugin.dra.options import DraOptions
from nvidia_device_plugin.events import HealthChange
from nvidia_device_plugin.health.policy import LOST
from nvidia_device_plugin.plans.resources import physical_uuid_of
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU, gpu_uuids, simulator, start_daemon
from support.dra_rules import validate_objects
from support.fake_apiserver import NODE, FakeResourceSliceApi
from support.podresources_standin import PodResourcesStandIn
from support.waiting import wait_for


@dataclass
class Node:
    daemon: Daemon
    kubelet: KubeletStandIn
    api: FakeResourceSliceApi
    pods: PodResourcesStandIn
    config: list[Config]  # [the config the daemon loads next]
    uuids: list[str]

    def reconfigure(self, config: Config) -> None:
        self.config[0] = config
        assert self.daemon.reload("test")

    def plugin_gpus(self) -> set[str]:
        return (
            {physical_uuid_of(i) for i in self.kubelet.devices(GPU)}
            if GPU in self.kubelet.resources()
            else set()
        )

    def sliced(self) -> set[str]:
        return {_parent(d) for d in self.api.devices().values()}

    def settled(self) -> bool:
        dra = self.daemon.dra
        return dra is not None and not any(str(v).startswith("moving") for v in dra.owners().values())

    def readings(self, count: int) -> None:
        """Wait until the handover has read pod-resources `count` more times."""
        target = self.pods.calls + count
        wait_for(lambda: self.pods.calls >= target, f"{count} pod-resources readings")


def _parent(device: dict[str, Any]) -> str:
    attributes = device["attributes"]
    return str((attributes.get("parentUUID") or attributes["uuid"])["string"])


def dra(gpus: str | tuple[str, ...], **more: Any) -> Config:
    return Config(dra=Dra(enabled=True, gpus=gpus), **more)


@contextmanager
def dra_node(
    plugin_dir: Path,
    kubelet: KubeletStandIn,
    config: Config,
    preset: str = "dgx-a100",
    restart_grace_s: float = 0.2,
    settle: bool = True,
) -> Iterator[Node]:
    with FakeResourceSliceApi() as api, PodResourcesStandIn(plugin_dir / "pod-resources.sock") as pods:
        options = DraOptions(
            node_name=NODE,
            pod_resources_socket=plugin_dir / "pod-resources.sock",
            kubelet_plugins_dir=plugin_dir / "plugins",
            kubelet_registry_dir=plugin_dir / "plugins_registry",
            api_client=lambda: api_client_for(api.url),
            poll_interval_s=0.01,
            kubelet_restart_grace_s=restart_grace_s,
        )
        holder = [config]

        def load() -> Config:  # the per-claim CDI specs in the test's own directory, never /var/run/cdi
            plugin = replace(holder[0].flags.plugin, cdi_spec_dir=str(plugin_dir / "cdi"))
            return replace(holder[0], flags=replace(holder[0].flags, plugin=plugin))

        daemon = start_daemon(plugin_dir, preset, load, dra=options)
        try:
            node = Node(daemon, kubelet, api, pods, holder, gpu_uuids(daemon))
            if settle:
                wait_for(node.settled, "the first handover")
            yield node
        finally:
            daemon.stop()


def test_with_all_gpus_the_device_plugin_advertises_none_and_the_slices_all(
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    with dra_node(plugin_dir, kubelet, dra("all")) as node:
        wait_for(lambda: len(node.sliced()) == 8, "8 GPUs in the slices")
        assert kubelet.wait_for_resources([GPU])
        assert node.plugin_gpus() == set()  # nvidia.com/gpu allocatable 0: KEP-5004 takes that name to DRA
        assert node.sliced() == set(node.uuids)
        validate_objects(node.api.current())


def test_a_gpu_moves_to_dra_only_once_no_pod_holds_it(plugin_dir: Path, kubelet: KubeletStandIn) -> None:
    with dra_node(plugin_dir, kubelet, dra(())) as node:
        wait_for(lambda: len(node.plugin_gpus()) == 8, "8 GPUs with the device plugin")
        gpu0 = node.uuids[0]
        with node.pods.lock:
            node.pods.plugin["training"] = (GPU, [gpu0])
        node.reconfigure(dra(("0",)))
        wait_for(lambda: gpu0 not in node.plugin_gpus(), "GPU 0 to leave the device plugin")
        node.readings(5)
        assert gpu0 not in node.sliced() and not node.settled()  # still held: served by neither
        with node.pods.lock:
            del node.pods.plugin["training"]
        wait_for(lambda: node.sliced() == {gpu0}, "GPU 0 in the slices")
        assert gpu0 not in node.plugin_gpus()


def test_a_pod_holding_a_gpu_under_a_resource_name_the_new_config_renamed_keeps_it_from_dra(
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    """The pod was admitted as nvidia.com/gpu; the config that moves its GPU to DRA also renames the
    resource (renameByDefault: nvidia.com/gpu.shared), so the pod's ID is under a name no plan has now."""
    with dra_node(plugin_dir, kubelet, dra(())) as node:
        wait_for(lambda: len(node.plugin_gpus()) == 8, "8 GPUs with the device plugin")
        gpu0 = node.uuids[0]
        with node.pods.lock:
            node.pods.plugin["training"] = (GPU, [gpu0])
        shared = ReplicatedResources(rename_by_default=True, resources=(ReplicatedResource(GPU, 2),))
        node.reconfigure(dra(("0",), sharing=Sharing(time_slicing=shared)))
        node.readings(5)
        assert gpu0 not in node.sliced() and not node.settled()  # still held: served by neither
        with node.pods.lock:
            del node.pods.plugin["training"]
        wait_for(lambda: node.sliced() == {gpu0}, "GPU 0 in the slices once the pod ended")


def test_a_gpu_goes_back_to_the_device_plugin_only_once_its_claims_are_gone(
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    with dra_node(plugin_dir, kubelet, dra(("0", "1"))) as node:
        gpu1 = node.uuids[1]
        wait_for(lambda: node.sliced() == set(node.uuids[:2]), "GPUs 0 and 1 in the slices")
        with node.pods.lock:
            node.pods.claims["inference"] = [("gpu.nvidia.com", NODE, "gpu-1")]
        node.reconfigure(dra(("0",)))
        wait_for(lambda: node.sliced() == {node.uuids[0]}, "GPU 1 to leave the slices")
        node.readings(5)
        assert gpu1 not in node.plugin_gpus()
        with node.pods.lock:
            del node.pods.claims["inference"]
        wait_for(lambda: gpu1 in node.plugin_gpus(), "GPU 1 back with the device plugin")
        node.reconfigure(Config())  # DRA off: every GPU back, the slices empty
        wait_for(lambda: len(node.plugin_gpus()) == 8 and node.sliced() == set(), "everything back")


def test_without_pod_resources_no_gpu_moves(plugin_dir: Path, kubelet: KubeletStandIn) -> None:
    with dra_node(plugin_dir, kubelet, dra(())) as node:
        node.pods.failing = True
        node.reconfigure(dra(("2",)))
        node.readings(5)
        assert node.uuids[2] not in node.plugin_gpus() | node.sliced()
        node.pods.failing = False
        wait_for(lambda: node.sliced() == {node.uuids[2]}, "GPU 2 in the slices once kubelet answers")


def test_a_kubelet_restart_s_empty_answers_do_not_free_a_held_gpu(
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    """Kubelet restarts while GPU 0 moves to DRA: pod-resources fails, then answers from a new socket that
    no pod holds anything (its pods are not back yet). Those answers do not count within the grace."""
    with dra_node(plugin_dir, kubelet, dra(()), restart_grace_s=600) as node:
        wait_for(lambda: len(node.plugin_gpus()) == 8, "8 GPUs with the device plugin")
        gpu0 = node.uuids[0]
        with node.pods.lock:
            node.pods.plugin["training"] = (GPU, [gpu0])
        node.reconfigure(dra(("0",)))
        node.readings(3)
        node.pods.failing = True
        node.readings(3)
        node.pods.restoring = True
        node.pods.restart()
        node.pods.failing = False
        node.readings(5)
        assert gpu0 not in node.sliced() | node.plugin_gpus()
        assert node.daemon.dra is not None and node.daemon.dra.owners()[gpu0] == "moving to dra"


def _claim_spec(plugin_dir: Path, uid: str, devices: list[str]) -> Path:
    """A per-claim CDI spec as the kubelet plugin writes it for a prepared claim (its edits left out)."""
    path = plugin_dir / "cdi" / f"k8s.gpu.nvidia.com-claim_{uid}.json"
    path.parent.mkdir(exist_ok=True)
    names = [{"name": f"{uid}-{d}", "containerEdits": {}} for d in devices]
    path.write_text(json.dumps({"cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/claim", "devices": names}))
    return path


def test_a_gpu_whose_claim_spec_is_on_disk_stays_with_dra(plugin_dir: Path, kubelet: KubeletStandIn) -> None:
    """Kubelet 1.34/1.35 with the pod-resources DRA gate off reports no claim; the claim's CDI spec,
    there from prepare to unprepare, keeps its GPU on the DRA side."""
    with dra_node(plugin_dir, kubelet, dra(("0", "1"))) as node:
        gpu1 = node.uuids[1]
        wait_for(lambda: node.sliced() == set(node.uuids[:2]), "GPUs 0 and 1 in the slices")
        spec = _claim_spec(plugin_dir, "0f3c6b1e-0000-4a5e-9d7e-000000000001", ["gpu-1"])
        node.reconfigure(dra(("0",)))
        wait_for(lambda: node.sliced() == {node.uuids[0]}, "GPU 1 to leave the slices")
        node.readings(5)
        assert gpu1 not in node.plugin_gpus()
        spec.unlink()  # kubelet unprepared the claim
        wait_for(lambda: gpu1 in node.plugin_gpus(), "GPU 1 back with the device plugin")


def test_an_unreadable_claim_spec_keeps_every_gpu_with_dra(plugin_dir: Path, kubelet: KubeletStandIn) -> None:
    with dra_node(plugin_dir, kubelet, dra(("0", "1"))) as node:
        wait_for(lambda: node.sliced() == set(node.uuids[:2]), "GPUs 0 and 1 in the slices")
        spec = _claim_spec(plugin_dir, "0f3c6b1e-0000-4a5e-9d7e-000000000002", [])
        spec.write_text("{not json")
        node.reconfigure(dra(()))
        wait_for(lambda: node.sliced() == set(), "GPUs 0 and 1 to leave the slices")
        node.readings(5)
        assert not set(node.uuids[:2]) & node.plugin_gpus()
        spec.unlink()
        wait_for(lambda: len(node.plugin_gpus()) == 8, "GPUs 0 and 1 back with the device plugin")


def test_a_corrupt_checkpoint_keeps_every_gpu_with_dra_until_it_is_removed(
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    """The kubelet plugin sets a corrupt checkpoint aside and forgets the claims it listed: while the
    set-aside file is there, no GPU goes back to the device plugin."""
    checkpoint = plugin_dir / "plugins" / "gpu.nvidia.com" / "checkpoint.json"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_text('{"version": 1, "bootID": ')
    with dra_node(plugin_dir, kubelet, dra(("0", "1")), settle=False) as node:
        wait_for(lambda: node.sliced() == set(node.uuids[:2]), "GPUs 0 and 1 in the slices")
        aside = checkpoint.with_name("checkpoint.json.corrupt")
        assert aside.exists()
        node.readings(5)
        assert node.plugin_gpus() == set()  # GPUs 2-7 may have been DRA's in the run that wrote it
        node.reconfigure(dra(("0",)))
        wait_for(lambda: node.sliced() == {node.uuids[0]}, "GPU 1 to leave the slices")
        node.readings(5)
        assert node.plugin_gpus() == set()
        aside.unlink()  # the operator checked that no pod uses a claim prepared before
        wait_for(lambda: node.plugin_gpus() == set(node.uuids[1:]), "GPUs 1-7 with the device plugin")


class Load:
    """Pods on both sides while ownership flips: device-plugin pods take GPUs kubelet lists, DRA claims
    take devices the slices publish; each hold is checked against the other side's holds."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.stop = threading.Event()
        self.violations: list[str] = []
        self.holds = 0
        self._random = random.Random(24)

    def _held(self) -> tuple[set[str], set[str]]:
        pods = self.node.pods
        plugin = {ids[0] for _, ids in pods.plugin.values()}
        names = {f"gpu-{i}": uuid for i, uuid in enumerate(self.node.uuids)}
        claimed = {names[n] for claims in pods.claims.values() for _, _, n in claims}
        return plugin, claimed

    def _plugin_pod(self, n: int) -> None:
        free = sorted(self.node.plugin_gpus())
        if not free:
            return
        uuid = self._random.choice(free)
        try:
            self.node.kubelet.allocate(GPU, [[uuid]])  # refused once the GPU has left the device plugin
        except Exception:
            return
        with self.node.pods.lock:
            plugin, claimed = self._held()
            if uuid in plugin:
                return
            if uuid in claimed:
                self.violations.append(f"{uuid} allocated by the device plugin while a DRA claim holds it")
            self.node.pods.plugin[f"dp-{n}"] = (GPU, [uuid])
            self.holds += 1

    def _dra_claim(self, n: int) -> None:
        devices = sorted(self.node.api.devices())
        if not devices:
            return
        name = self._random.choice(devices)
        uuid = self.node.uuids[int(name.removeprefix("gpu-"))]
        with self.node.pods.lock:
            plugin, claimed = self._held()
            if uuid in claimed:
                return
            if uuid in plugin:
                self.violations.append(f"{uuid} claimed through DRA while a device-plugin pod holds it")
            self.node.pods.claims[f"dra-{n}"] = [("gpu.nvidia.com", NODE, name)]
            self.holds += 1

    def run(self) -> None:
        n = 0
        while not self.stop.wait(0.002):
            n += 1
            (self._plugin_pod if n % 2 else self._dra_claim)(n)
            with self.node.pods.lock:  # pods end: a few run at a time, the oldest ends now and then
                for pods in (self.node.pods.plugin, self.node.pods.claims):
                    ending = max(0, len(pods) - 3) + (1 if n % 10 == 0 else 0)
                    for key in sorted(pods, key=lambda k: int(k.split("-")[1]))[:ending]:
                        del pods[key]

    def sample(self) -> None:
        """Both sides at (nearly) one moment: before, during and after reading the slices."""
        while not self.stop.wait(0.001):
            before = self.node.plugin_gpus()
            sliced = self.node.sliced()
            after = self.node.plugin_gpus()
            if both := before & sliced & after:
                self.violations.append(f"served by both sides at once: {sorted(both)}")


def test_ownership_flips_under_load_never_serve_a_gpu_on_both_sides(
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    with dra_node(plugin_dir, kubelet, dra(("0", "1", "2", "3"))) as node:
        load = Load(node)

        def on_write(current: list[dict[str, Any]]) -> None:  # at the moment a slice changes
            sliced = {_parent(d) for s in current for d in s["spec"].get("devices") or []}
            with node.pods.lock:
                plugin, _ = load._held()
            if both := sliced & plugin:
                load.violations.append(f"published while a device-plugin pod holds it: {sorted(both)}")

        node.api.on_write = on_write
        threads = [threading.Thread(target=f, daemon=True) for f in (load.run, load.sample)]
        for thread in threads:
            thread.start()
        try:
            for gpus in (("4", "5", "6", "7"), "all", (), ("0", "2", "4", "6"), ("1", "3"), "all", ()):
                node.reconfigure(dra(gpus))
                wait_for(node.settled, f"the handover to {gpus}")
        finally:
            load.stop.set()
            for thread in threads:
                thread.join(5)
        assert load.violations == []
        assert load.holds > 20, "the load never ran"
        wait_for(lambda: len(node.plugin_gpus()) == 8 and node.sliced() == set(), "all GPUs back at the end")


def test_an_xid_taints_the_dra_device_and_recovery_lifts_it(
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    # The grace is how long the taint stays: long enough for a busy machine's pauses.
    config = dra("all", health=HealthConfig(recovery=Recovery(enabled=True, grace_period_seconds=2.0)))
    with dra_node(plugin_dir, kubelet, config, preset="mixed-a100-h100") as node:
        wait_for(lambda: len(node.sliced()) == 4, "4 GPUs in the slices")
        simulator(node.daemon).inject_xid(2, 79)

        def taints() -> list[dict[str, str]]:
            return list(node.api.devices().get("gpu-2", {}).get("taints") or [])

        wait_for(lambda: bool(taints()), "the XID taint")
        (taint,) = taints()
        assert (taint["key"], taint["value"], taint["effect"]) == ("gpu.nvidia.com/xid", "79", "NoSchedule")
        assert "timeAdded" in taint
        validate_objects(node.api.current())
        assert not node.api.devices()["gpu-1"].get("taints")
        wait_for(lambda: not taints(), "the taint to go once the GPU recovered")


def test_a_lost_gpu_gets_its_own_taint(plugin_dir: Path, kubelet: KubeletStandIn) -> None:
    with dra_node(plugin_dir, kubelet, dra("all"), preset="mixed-a100-h100") as node:
        wait_for(lambda: len(node.sliced()) == 4, "4 GPUs in the slices")
        # The monitor's verdict on a GPU that fell off (its liveness poll takes 5 s to say so; the verdict
        # is what the DRA side reads, through the registry, as from the monitor)
        node.daemon.registry.mark(HealthChange(uuid=node.uuids[1], healthy=False, cause=LOST))
        wait_for(
            lambda: (
                [t["key"] for t in node.api.devices()["gpu-1"].get("taints") or []]
                == ["gpu.nvidia.com/gpu-lost"]
            ),
            "the lost-GPU taint",
        )


def test_a_config_whose_dra_gpu_is_not_here_is_refused_and_the_last_good_one_kept(
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    with dra_node(plugin_dir, kubelet, dra(("0",))) as node:
        node.config[0] = dra(("12",))
        assert node.daemon.reload("test") is False
        wait_for(lambda: node.sliced() == {node.uuids[0]}, "GPU 0 still in the slices")
        # kubelet's list may still be on its way (the device plugin waits for the first slice sync).
        wait_for(lambda: node.plugin_gpus() == set(node.uuids[1:]), "GPUs 1-7 with the device plugin")


def test_verdicts_read_as_taints() -> None:
    from nvidia_device_plugin.dra.taints import taint_for
    from nvidia_device_plugin.health.policy import DOUBLE_BIT_ECC, stuck_cause, xid_cause
    from nvidia_device_plugin.health.registry import LOST_AT_START_UP

    assert taint_for(xid_cause(79)) == ("gpu.nvidia.com/xid", "79")
    assert taint_for(xid_cause(48)) == ("gpu.nvidia.com/xid", "48")
    assert taint_for(LOST) == taint_for(LOST_AT_START_UP) == ("gpu.nvidia.com/gpu-lost", None)
    assert taint_for(DOUBLE_BIT_ECC) == ("gpu.nvidia.com/unhealthy", "double-bit-ecc")
    assert taint_for(stuck_cause("nvmlDeviceGetMemoryInfo")) == ("gpu.nvidia.com/unhealthy", None)


def test_a_device_s_taints_are_read_from_the_registry_s_verdicts() -> None:
    """No second book: a verdict the registry held before anyone asked (as at DRA start-up) taints the
    device with its XID and its time, a GPU's verdict taints its MIG devices, and recovery lifts both."""
    from datetime import UTC, datetime

    from nvidia_device_plugin.devices import Gpu, MigDevice
    from nvidia_device_plugin.dra.kinds.gpu import GPU as GPU_KIND
    from nvidia_device_plugin.dra.kinds.mig import MIG as MIG_KIND
    from nvidia_device_plugin.dra.names import DraDevice
    from nvidia_device_plugin.dra.taints import HealthTaints
    from nvidia_device_plugin.health.policy import RECOVERED, xid_cause
    from nvidia_device_plugin.health.registry import HealthRegistry

    mig = MigDevice("MIG-0", 0, "GPU-0", 0, "1g.10gb", 10 << 30, gpu_instance_id=1, compute_instance_id=0)
    gpu = Gpu(0, "GPU-0", "NVIDIA A100-SXM4-80GB", 80 << 30, "00000000:07:00.0", 0, None, True, (mig,))
    registry = HealthRegistry(wall_clock=lambda: datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    registry.mark(HealthChange(uuid=mig.uuid, healthy=False, cause=xid_cause(94)))
    taints = HealthTaints(registry.verdicts)
    whole, part = DraDevice("gpu-0", gpu, None, GPU_KIND), DraDevice("gpu-0-mig", gpu, mig, MIG_KIND)
    assert taints.taints(whole) == []
    assert [t.to_json() for t in taints.taints(part)] == [
        {
            "key": "gpu.nvidia.com/xid",
            "value": "94",
            "effect": "NoSchedule",
            "timeAdded": "2026-01-02T03:04:05Z",
        }
    ]
    registry.mark(HealthChange(uuid=gpu.uuid, healthy=False, cause=xid_cause(79)))
    assert [(t.key, t.value) for t in taints.taints(part)] == [("gpu.nvidia.com/xid", "79")]  # one per key
    assert [(t.key, t.value) for t in taints.taints(whole)] == [("gpu.nvidia.com/xid", "79")]
    registry.mark(HealthChange(uuid=gpu.uuid, healthy=True, cause=RECOVERED))
    registry.mark(HealthChange(uuid=mig.uuid, healthy=True, cause=RECOVERED))
    assert taints.taints(whole) == taints.taints(part) == []

"""GetPreferredAllocation does bounded work per request (issue 23 item 15: a request of 5,600 took ~2 s and
slowed Allocate 71-77x under 4 callers; the whole-GPU search was exponential in the node's size).

The daemon serves simulated nodes; the requests come over the plugin's socket as kubelet sends them, with
a deadline only as a hang guard.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import grpc
import pytest
import yaml

from nvidia_device_plugin.config.v1 import Config, ReplicatedResource, ReplicatedResources, Sharing
from nvidia_device_plugin.plans.resources import physical_uuid_of
from nvidia_device_plugin.serving import preferred_gpus
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU, start_daemon
from support.kubelet_standin import kubelet_standin
from support.waiting import scaled

HANG_GUARD_S = 30.0


def uneven_node(path: Path, gpus: int, seed: int = 1) -> Path:
    """A node file with `gpus` V100s and uneven NVLink between random pairs: every set scores differently,
    so nothing prunes the whole-GPU search early."""
    rng = random.Random(seed)
    doc = {
        "name": f"uneven-{gpus}",
        "driver_version": "550.54.15",
        "cuda_driver_version": 12040,
        "gpus": [
            {
                "name": "Tesla V100-SXM2-32GB",
                "memory_mib": 32768,
                "pci_bus_id": f"00000000:{16 + i:02X}:00.0",
                "numa_node": i * 2 // gpus,
                "pcie_switch": i // 4,
            }
            for i in range(gpus)
        ],
        "nvlinks": [
            [a, b, rng.randint(1, 3)] for a in range(gpus) for b in range(a + 1, gpus) if rng.random() < 0.3
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("gpus", [48, 64])
def test_a_whole_gpu_request_on_a_huge_node_is_answered_within_the_search_budget(
    tmp_path: Path, plugin_dir: Path, kubelet: KubeletStandIn, gpus: int
) -> None:
    daemon = start_daemon(plugin_dir, str(uneven_node(tmp_path / "node.yaml", gpus)))
    try:
        assert kubelet.wait_for_resources([GPU])
        available = sorted(kubelet.devices(GPU))
        assert len(available) == gpus
        chosen = kubelet.preferred(GPU, available, available[:1], gpus // 2, timeout=HANG_GUARD_S)
        assert len(set(chosen)) == gpus // 2 and set(chosen) <= set(available)
        assert available[0] in chosen
        # The same request answers the same (the capped search is deterministic).
        assert kubelet.preferred(GPU, available, available[:1], gpus // 2, timeout=HANG_GUARD_S) == chosen
    finally:
        daemon.stop()


def test_without_any_search_budget_the_answer_is_the_greedy_set(tmp_path: Path, plugin_dir: Path) -> None:
    # The search starts from the greedy answer, so even a budget of 0 steps answers a full, valid set.
    with kubelet_standin(plugin_dir) as kubelet:
        daemon = start_daemon(plugin_dir, str(uneven_node(tmp_path / "node.yaml", 24)))
        try:
            assert kubelet.wait_for_resources([GPU])
            available = sorted(kubelet.devices(GPU))
            searched = kubelet.preferred(GPU, available, [], 8, timeout=HANG_GUARD_S)
            steps, preferred_gpus.MAX_SEARCH_STEPS = preferred_gpus.MAX_SEARCH_STEPS, 0
            try:
                greedy = kubelet.preferred(GPU, available, [], 8, timeout=HANG_GUARD_S)
            finally:
                preferred_gpus.MAX_SEARCH_STEPS = steps
            assert len(set(greedy)) == len(set(searched)) == 8
            assert set(greedy) <= set(available)
        finally:
            daemon.stop()


def test_a_request_for_16000_of_20000_replicas_is_spread_over_the_gpus(
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    entry = ReplicatedResource(name=GPU, replicas=2500)
    config = Config(sharing=Sharing(time_slicing=ReplicatedResources(resources=(entry,))))
    daemon = start_daemon(plugin_dir, load_config=lambda: config)
    try:
        assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 20_000, timeout=scaled(30))
        available = sorted(kubelet.devices(GPU))
        try:
            chosen = kubelet.preferred(GPU, available, [], 16_000, timeout=HANG_GUARD_S)
        except grpc.RpcError as exc:
            pytest.fail(f"GetPreferredAllocation of 16,000: {exc.code()} {exc.details()}")
        assert len(set(chosen)) == 16_000 and set(chosen) <= set(available)
        assert set(Counter(physical_uuid_of(i) for i in chosen).values()) == {2000}  # distributed
    finally:
        daemon.stop()

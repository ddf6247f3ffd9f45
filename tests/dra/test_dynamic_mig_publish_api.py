"""Dynamic MIG's slices on their way out: the publisher puts the counter sets and the partitions in the API
server (a stand-in over real HTTP) and a resync of the same leaves them alone; `dra plan` with
`dra.dynamicMig` on a node already partitioned by hand publishes its MIG devices as the placements they
occupy and nothing over them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from test_dynamic_mig_publish import (
    a100,
    allocate,
    check_counter_rules,
    counter_sets_of,
    devices_of,
    profile,
)

from nvidia_device_plugin.config.loader import parse_config_text
from nvidia_device_plugin.configmanager.nodewatch import api_client_for
from nvidia_device_plugin.dra.apiserver import KubeSliceApi
from nvidia_device_plugin.dra.dryrun import dry_run
from nvidia_device_plugin.dra.publisher import SlicePublisher
from nvidia_device_plugin.dra.slices import node_counter_sets, node_devices
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.snapshot import build_snapshot

from support.dra_rules import validate_objects
from support.fake_apiserver import NODE, FakeResourceSliceApi
from support.inventories import node
from support.waiting import wait_for


@pytest.fixture
def api() -> Iterator[FakeResourceSliceApi]:
    with FakeResourceSliceApi() as fake:
        yield fake


def test_the_publisher_puts_counter_sets_and_partitions_and_a_resync_keeps_them(
    api: FakeResourceSliceApi,
) -> None:
    inventory = node(*(a100(i) for i in range(4)))
    uuids = frozenset(g.uuid for g in inventory.gpus)
    devices = node_devices(inventory, [], uuids, dynamic_mig=True)
    counter_sets = node_counter_sets(inventory, uuids, True)
    publisher = SlicePublisher(KubeSliceApi(api_client_for(api.url)), NODE)
    publisher.start()
    try:
        publisher.publish(devices, uuids, counter_sets)
        wait_for(lambda: publisher.syncs == 1, "the first sync")
        current = api.current()
        assert sorted(len(s["spec"].get("devices", [])) for s in current) == [0, 8, 64]  # 72 partitions
        assert list(counter_sets_of(current)) == [f"gpu-{i}-counter-set" for i in range(4)]
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in current} == {3}
        validate_objects(current)
        check_counter_rules(current)
        writes = list(api.writes)
        publisher.publish(devices, uuids, counter_sets)  # the same again: nothing to write
        wait_for(lambda: publisher.syncs == 2, "the second sync")
        assert api.writes == writes and publisher.published == uuids
    finally:
        publisher.stop()


def test_dra_plan_on_a_node_partitioned_by_hand_publishes_what_exists_and_nothing_over_it() -> None:
    text = "version: v1\nflags: {migStrategy: mixed}\ndra: {enabled: true, dynamicMig: true}\n"
    session = open_nvml("a100-mig-mixed")
    try:
        snapshot = build_snapshot(session, parse_config_text(text))  # placements as the simulator lists them
    finally:
        session.close()
    result = dry_run(snapshot, "gpu-node-1")
    assert validate_objects(result.slices) == len(result.slices)
    check_counter_rules(result.slices)
    devices = devices_of(result.slices)
    gpu1 = sorted(name for name in devices if name.startswith("gpu-1-"))
    # GPU 1: 3g.40gb at 4, 2g.20gb at 0, 1g.10gb at 2 and 3 cover all eight slices: the devices that exist,
    # under NVIDIA's GI profile IDs, and no free placement beside them.
    assert gpu1 == [
        "gpu-1-mig-1g10gb-19-2",
        "gpu-1-mig-1g10gb-19-3",
        "gpu-1-mig-2g20gb-14-0",
        "gpu-1-mig-3g40gb-9-4",
    ]
    assert all("uuid" in devices[name]["attributes"] for name in gpu1)
    assert devices["gpu-1-mig-3g40gb-9-4"]["attributes"]["resourceName"] == {
        "string": "nvidia.com/mig-3g.40gb"
    }
    assert "gpu-3" in devices and "consumesCounters" not in devices["gpu-3"]  # not in MIG mode: whole
    assert "gpu-1-counter-set" in counter_sets_of(result.slices)
    assert allocate(result.slices, [profile("3g.40gb")] * 2) is not None  # GPU 0 and GPU 1 hold one each
    off = dry_run(replace(snapshot, config=parse_config_text(text.replace("dynamicMig: true", ""))))
    assert counter_sets_of(off.slices) == {}

"""The ResourceSlice publisher against a stand-in API server over real HTTP: the upstream controller's
generation rules, the Node as owner, at most 128/64 devices per slice, a restart that continues the
pool's generation, and API failures retried without losing the wanted state."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from nvidia_device_plugin.configmanager.nodewatch import api_client_for
from nvidia_device_plugin.dra.apiserver import KubeSliceApi
from nvidia_device_plugin.dra.publisher import SlicePublisher
from nvidia_device_plugin.dra.sync import plan_sync

from support.dra_rules import validate_objects
from support.fake_apiserver import NODE, FakeResourceSliceApi
from support.waiting import wait_for


def _device(n: int, tainted: bool = False) -> dict[str, Any]:
    device: dict[str, Any] = {"name": f"gpu-{n}", "attributes": {"type": {"string": "gpu"}}}
    if tainted:
        device["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    return device


@pytest.fixture
def api() -> Iterator[FakeResourceSliceApi]:
    with FakeResourceSliceApi() as fake:
        yield fake


def _publisher(api: FakeResourceSliceApi) -> SlicePublisher:
    publisher = SlicePublisher(KubeSliceApi(api_client_for(api.url)), NODE)
    publisher.start()
    return publisher


def _publish(publisher: SlicePublisher, devices: list[dict[str, Any]]) -> None:
    before = publisher.syncs
    publisher.publish(devices, frozenset())
    wait_for(lambda: publisher.syncs > before, "a sync")


def test_one_slice_owned_by_the_node_then_updated_in_place(api: FakeResourceSliceApi) -> None:
    publisher = _publisher(api)
    try:
        _publish(publisher, [_device(0), _device(1)])
        (only,) = api.current()
        assert only["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-1", "controller": True}
        ]
        assert only["metadata"]["name"].startswith(f"{NODE}-gpu.nvidia.com-")
        assert only["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
        assert only["spec"]["nodeName"] == NODE and only["spec"]["driver"] == "gpu.nvidia.com"
        _publish(publisher, [_device(0), _device(1, tainted=True)])
        (again,) = api.current()
        # one slice, one update: the generation stays (one write is atomic)
        assert again["metadata"]["name"] == only["metadata"]["name"]
        assert again["spec"]["pool"]["generation"] == 1 and "taints" in again["spec"]["devices"][1]
        assert api.writes == [("create", only["metadata"]["name"]), ("update", only["metadata"]["name"])]
        validate_objects(api.current())
    finally:
        publisher.stop()


def test_a_growing_pool_bumps_the_generation_and_rewrites_every_slice(api: FakeResourceSliceApi) -> None:
    publisher = _publisher(api)
    try:
        _publish(publisher, [_device(n) for n in range(100)])
        assert [len(s["spec"]["devices"]) for s in api.current()] == [100]
        _publish(publisher, [_device(0, tainted=True)] + [_device(n) for n in range(1, 100)])
        current = api.current()
        assert sorted(len(s["spec"]["devices"]) for s in current) == [36, 64]  # taints: 64 per slice
        assert {s["spec"]["pool"]["generation"] for s in current} == {2}
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in current} == {2}
        assert len(api.slices) == 2  # nothing obsolete is left behind
        validate_objects(current)
    finally:
        publisher.stop()


def test_a_restarted_publisher_continues_the_pools_generation(api: FakeResourceSliceApi) -> None:
    first = _publisher(api)
    _publish(first, [_device(n) for n in range(200)])
    first.stop()
    assert {s["spec"]["pool"]["generation"] for s in api.current()} == {1}
    second = _publisher(api)
    try:
        _publish(second, [_device(n) for n in range(3)])
        (only,) = api.current()
        assert only["spec"]["pool"]["generation"] == 2 and len(api.slices) == 1
    finally:
        second.stop()


def test_api_failures_are_retried_and_the_last_wanted_state_lands(
    api: FakeResourceSliceApi, caplog: pytest.LogCaptureFixture
) -> None:
    api.fail_next(2, 503)
    publisher = _publisher(api)
    try:
        publisher.publish([_device(0)], frozenset({"GPU-0"}))
        wait_for(lambda: publisher.syncs == 1, "a sync after the failures")
        assert publisher.published == frozenset({"GPU-0"})
        assert [d["name"] for d in api.current()[0]["spec"]["devices"]] == ["gpu-0"]
        failures = [r for r in caplog.records if "publishing the ResourceSlices" in r.getMessage()]
        assert len(failures) == 1 and "503" in failures[0].getMessage()  # logged once, not per retry
    finally:
        publisher.stop()


def test_the_sync_plan_follows_the_upstream_rules() -> None:
    def stored(name: str, generation: int, names: list[str], count: int = 1) -> dict[str, Any]:
        spec = {
            "driver": "gpu.nvidia.com",
            "pool": {"name": "n", "generation": generation, "resourceSliceCount": count},
            "nodeName": "n",
            "devices": [{"name": d} for d in names],
        }
        return {"metadata": {"name": name, "uid": f"u-{name}", "resourceVersion": "7"}, "spec": spec}

    same = plan_sync([stored("a", 3, ["gpu-0"])], [[{"name": "gpu-0"}]], "n", "uid")
    assert same.empty and same.generation == 3
    old = plan_sync([stored("a", 2, ["gpu-0"]), stored("b", 3, ["gpu-0"])], [[{"name": "gpu-0"}]], "n", "uid")
    assert old.deletes == [("a", "u-a", "7")] and not old.updates and not old.creates
    two = [stored("a", 1, ["gpu-0"], 2), stored("b", 1, ["gpu-1"], 2)]
    one_change = plan_sync(two, [[{"name": "gpu-0"}], [{"name": "gpu-1", "x": 1}]], "n", "uid")
    assert one_change.generation == 1 and [u["metadata"]["name"] for u in one_change.updates] == ["b"]
    both = plan_sync(two, [[{"name": "gpu-0", "x": 1}], [{"name": "gpu-1", "x": 1}]], "n", "uid")
    assert both.generation == 2 and len(both.updates) == 2
    regrouped = plan_sync(two, [[{"name": "gpu-0"}, {"name": "gpu-1"}]], "n", "uid")
    assert regrouped.generation == 2 and len(regrouped.creates) == 1 and len(regrouped.deletes) == 2

"""At start, a MIG device made for a claim kubelet can no longer have is destroyed (dra/kubelet/
stale_claims.py), on a100-mig-dynamic through the real sockets and the stand-in API server: a claim deleted
while the plugin was down, one made anew under the same name, one no longer allocated. A claim that exists
keeps its device; an API that does not answer keeps everything until it answers."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from test_dynamic_mig_prepare import ONE_G, TWO_G, Setup, _setup, uid

from nvidia_device_plugin.dra.kubelet.plugin import DraKubeletPlugin

from support.dra_kubelet import resource_claim
from support.waiting import wait_for

FAST_RETRY_S = (0.05, 0.2)


@pytest.fixture
def node() -> Iterator[Setup]:
    yield from _setup()


def restart(node: Setup) -> DraKubeletPlugin:
    """The plugin stopped and started again (kubelet restarted with it), retrying the API quickly."""
    node.dra.started[-1].stop()
    node.kubelet.restart()
    plugin = node.dra.plugin(
        node=node.live.view, dynamic_mig=node.live.dynamic_mig(), stale_retry_s=FAST_RETRY_S
    )
    node.kubelet.driver()
    return plugin


def two_claims(node: Setup) -> tuple[str, str]:
    """Claim 1 on a 2g.20gb at slices 0-1, claim 2 on a 1g.10gb at slice 6, prepared: their MIG UUIDs."""
    node.allocate(1, node.placement("2g.20gb", TWO_G, 0))
    node.allocate(2, node.placement("1g.10gb", ONE_G, 6))
    assert [a.error for a in node.prepare(1, 2).values()] == ["", ""]
    made = {m.placement: m.uuid for m in node.live.migs()}
    return made[(0, 2)], made[(6, 1)]


def reads_of(node: Setup, name: str) -> int:
    with node.dra.api.claims.lock:
        return node.dra.api.claims.reads.count(("default", name))


def spec_path_exists(node: Setup, n: int) -> bool:
    return (node.dra.spec_dir / f"k8s.gpu.nvidia.com-claim_{uid(n)}.json").exists()


def test_a_claim_deleted_while_the_plugin_was_down_loses_its_instance_at_start(
    node: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = two_claims(node)
    node.dra.started[-1].stop()
    node.dra.api.claims.delete("default", "claim-1")

    def said() -> list[str]:  # the lines naming the claim, why, and its MIG device
        lines = [r.getMessage() for r in caplog.records]
        named = [line for line in lines if "claim default/claim-1" in line and first in line]
        return [line for line in named if "deleted" in line]

    with caplog.at_level(logging.INFO, logger="nvidia_device_plugin.dra.kubelet"):
        restart(node)
        wait_for(lambda: [m.uuid for m in node.live.migs()] == [second], "claim 1's instance destroyed")
        wait_for(lambda: uid(1) not in node.checkpoint()["claims"], "claim 1's entry removed")
        # The sweep says so once the claim is unprepared: after its entry is gone.
        wait_for(lambda: bool(said()), "the sweep to say why claim 1 was unprepared")
    assert not spec_path_exists(node, 1) and spec_path_exists(node, 2)
    assert node.checkpoint()["claims"][uid(2)]["migInstances"][0]["migUUID"] == second
    assert len(said()) == 1, [r.getMessage() for r in caplog.records]  # one line
    # Its slices are free again: a claim allocated the same placement gets a device there.
    node.allocate(3, node.placement("2g.20gb", TWO_G, 0))
    assert node.prepare(3)[uid(3)].error == ""
    assert sorted(m.placement for m in node.live.migs()) == [(0, 2), (6, 1)]


def test_a_claim_that_still_exists_keeps_its_instance(node: Setup) -> None:
    first, second = two_claims(node)
    before = reads_of(node, "claim-1")
    plugin = restart(node)
    wait_for(lambda: reads_of(node, "claim-1") > before and reads_of(node, "claim-2") > 0, "the claims read")
    plugin.stop()  # joins the sweep: whatever it decided is done
    assert sorted(m.uuid for m in node.live.migs()) == sorted([first, second])
    assert {uid(1), uid(2)} <= set(node.checkpoint()["claims"])
    assert spec_path_exists(node, 1) and spec_path_exists(node, 2)


def test_an_api_that_does_not_answer_keeps_everything_and_is_asked_again(node: Setup) -> None:
    first, second = two_claims(node)
    node.dra.started[-1].stop()
    node.dra.api.claims.delete("default", "claim-1")
    node.dra.api.claims.failure = (500, "etcd is down")
    before = reads_of(node, "claim-1")
    restart(node)
    wait_for(lambda: reads_of(node, "claim-1") >= before + 3, "claim 1 asked for again")
    assert sorted(m.uuid for m in node.live.migs()) == sorted([first, second])
    assert uid(1) in node.checkpoint()["claims"] and spec_path_exists(node, 1)
    with node.dra.api.claims.lock:
        node.dra.api.claims.failure = None  # the API answers again: 404 for claim 1
    wait_for(lambda: [m.uuid for m in node.live.migs()] == [second], "claim 1's instance destroyed")
    wait_for(lambda: uid(1) not in node.checkpoint()["claims"], "claim 1's entry removed")


def test_a_claim_made_anew_under_the_same_name_does_not_keep_the_old_ones_instance(node: Setup) -> None:
    first, second = two_claims(node)
    node.dra.started[-1].stop()
    device = node.placement("2g.20gb", TWO_G, 0)
    node.dra.api.claims.put(resource_claim(uid(99), name="claim-1", results=[("mig", device)]))
    restart(node)
    wait_for(lambda: [m.uuid for m in node.live.migs()] == [second], "the old claim 1's instance destroyed")
    wait_for(lambda: uid(1) not in node.checkpoint()["claims"], "the old claim 1's entry removed")
    assert first not in {m.uuid for m in node.live.migs()}


def test_a_claim_no_longer_allocated_that_device_loses_its_instance(node: Setup) -> None:
    _, second = two_claims(node)
    node.dra.started[-1].stop()
    node.dra.api.claims.put(resource_claim(uid(1), name="claim-1", allocated=False))
    restart(node)
    wait_for(lambda: [m.uuid for m in node.live.migs()] == [second], "claim 1's instance destroyed")
    wait_for(lambda: uid(1) not in node.checkpoint()["claims"], "claim 1's entry removed")

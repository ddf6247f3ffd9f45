"""NodePrepareResources / NodeUnprepareResources through the real socket, as kubelet calls them: claims
read from the stand-in API server, CDI specs per claim (checked against the CDI schema), refusals per
claim with a reason an operator can act on, and requests refused as a whole when malformed."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest

from nvidia_device_plugin.api.dra.v1 import api_pb2 as pb
from nvidia_device_plugin.dra.kubelet.cdispec import claim_spec_file
from nvidia_device_plugin.dra.names import DRIVER_NAME
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.snapshot import build_snapshot

from support.dra_kubelet import NODE, DraKubeletStandIn, DraNode, cdi_support, dra_node, resource_claim

UID = "0f3c6b1e-1111-4a5e-9d7e-000000000001"
OTHER = "0f3c6b1e-2222-4a5e-9d7e-000000000002"
CLAIM = ("default", "gpu-claim", UID)


@pytest.fixture
def dra() -> Iterator[DraNode]:
    yield from dra_node()


@pytest.fixture
def kubelet(dra: DraNode) -> Iterator[DraKubeletStandIn]:
    dra.plugin()
    with DraKubeletStandIn(dra.registry_dir) as k:
        k.driver()
        yield k


def devices_of(answer: pb.NodePrepareResourceResponse) -> list[tuple[list[str], str, str, list[str]]]:
    assert answer.error == ""
    return [
        (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in answer.devices
    ]


def minor_of(dra: DraNode, device: str) -> int:
    return dra.node.devices[device].gpu.minor


def test_a_whole_gpu_claim_gets_its_cdi_id_and_a_spec_with_its_device_node(
    dra: DraNode, kubelet: DraKubeletStandIn
) -> None:
    dra.api.claims.put(resource_claim(UID, results=[("gpu", "gpu-3")]))
    answer = kubelet.prepare([CLAIM])[UID]
    assert devices_of(answer) == [(["gpu"], NODE, "gpu-3", [f"k8s.gpu.nvidia.com/claim={UID}-gpu-3"])]
    spec = dra.spec(UID)  # schema-checked
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert spec["cdiVersion"] == "0.5.0"  # device nodes with a hostPath; a UID may start with a digit
    [device] = spec["devices"]
    assert device["name"] == f"{UID}-gpu-3"
    node = f"/dev/nvidia{minor_of(dra, 'gpu-3')}"
    assert device["containerEdits"]["deviceNodes"][0] == {"path": node, "hostPath": node}
    common = spec["containerEdits"]
    lib = "/usr/lib/x86_64-linux-gnu"
    assert common["env"] == [f"NVIDIA_CTK_LIBCUDA_DIR={lib}", "NVIDIA_VISIBLE_DEVICES=void"]  # the cdi/ edits
    assert "/dev/nvidiactl" in [n["path"] for n in common["deviceNodes"]]
    version = dra.node.inventory.driver_version
    assert f"/usr/lib/x86_64-linux-gnu/libcuda.so.{version}" in {m["containerPath"] for m in common["mounts"]}


def test_a_claims_container_gets_what_the_device_plugins_cdi_spec_gives_the_same_gpu(
    dra: DraNode, kubelet: DraKubeletStandIn
) -> None:
    dra.api.claims.put(resource_claim(UID, results=[("gpu", "gpu-3"), ("gpu", "gpu-5")]))
    assert kubelet.prepare([CLAIM])[UID].error == ""
    cdi = cdi_support()
    session = open_nvml("dgx-a100")
    try:
        plugin_spec = cdi.gpu_spec(build_snapshot(session, cdi.cdi_config("cdi-cri"))).document
    finally:
        session.close()
    by_uuid = {d["name"]: d["containerEdits"] for d in plugin_spec["devices"]}
    spec = dra.spec(UID)
    assert [d["containerEdits"] for d in spec["devices"]] == [
        by_uuid[dra.node.devices["gpu-3"].uuid],
        by_uuid[dra.node.devices["gpu-5"].uuid],
    ]
    assert spec["containerEdits"] == plugin_spec["containerEdits"]


def test_subrequest_names_are_stripped_and_other_drivers_results_are_left_alone(
    dra: DraNode, kubelet: DraKubeletStandIn
) -> None:
    claim = resource_claim(UID, results=[("gpus/a100", "gpu-0"), ("gpus/a100", "gpu-1")])
    claim["status"]["allocation"]["devices"]["results"].append(
        {"request": "nic", "driver": "nic.example.com", "pool": NODE, "device": "eth1"}
    )
    dra.api.claims.put(claim)
    answer = kubelet.prepare([CLAIM])[UID]
    assert [(r, d) for r, _, d, _ in devices_of(answer)] == [(["gpus"], "gpu-0"), (["gpus"], "gpu-1")]
    assert [d["name"] for d in dra.spec(UID)["devices"]] == [f"{UID}-gpu-0", f"{UID}-gpu-1"]


def test_a_device_shared_by_two_requests_is_one_device_with_both_request_names(
    dra: DraNode, kubelet: DraKubeletStandIn
) -> None:
    dra.api.claims.put(resource_claim(UID, results=[("train", "gpu-2"), ("eval", "gpu-2")]))
    assert devices_of(kubelet.prepare([CLAIM])[UID]) == [
        (["train", "eval"], NODE, "gpu-2", [f"k8s.gpu.nvidia.com/claim={UID}-gpu-2"])
    ]
    assert len(dra.spec(UID)["devices"]) == 1


def test_a_claim_with_no_device_of_this_driver_prepares_nothing(
    dra: DraNode, kubelet: DraKubeletStandIn
) -> None:
    dra.api.claims.put(resource_claim(UID, results=[("nic", "eth1")], driver="nic.example.com"))
    assert devices_of(kubelet.prepare([CLAIM])[UID]) == []
    assert not (dra.spec_dir / claim_spec_file(UID)).exists()


def test_prepare_is_idempotent_and_answers_from_the_checkpoint(
    dra: DraNode, kubelet: DraKubeletStandIn
) -> None:
    dra.api.claims.put(resource_claim(UID))
    first = kubelet.prepare([CLAIM])[UID]
    spec = dra.spec(UID)
    dra.api.claims.delete("default", "gpu-claim")  # the API is not asked again
    again = kubelet.prepare([CLAIM])[UID]
    assert again == first and dra.spec(UID) == spec
    assert dra.api.claims.reads == [("default", "gpu-claim")]


def test_unprepare_removes_the_spec_and_the_entry_and_a_second_unprepare_succeeds(
    dra: DraNode, kubelet: DraKubeletStandIn
) -> None:
    dra.api.claims.put(resource_claim(UID))
    kubelet.prepare([CLAIM])
    assert dra.started[0].prepared() == {UID: ("gpu-0",)}
    assert kubelet.unprepare([CLAIM])[UID].error == ""
    assert not (dra.spec_dir / claim_spec_file(UID)).exists()
    assert dra.started[0].prepared() == {}
    assert kubelet.unprepare([CLAIM])[UID].error == ""


def test_unprepare_of_a_claim_never_prepared_succeeds(dra: DraNode, kubelet: DraKubeletStandIn) -> None:
    answer = kubelet.unprepare([("default", "never", OTHER)])
    assert list(answer) == [OTHER] and answer[OTHER].error == ""
    assert dra.api.claims.reads == []


def test_a_replaced_claim_is_refused(dra: DraNode, kubelet: DraKubeletStandIn) -> None:
    dra.api.claims.put(resource_claim(OTHER))  # same name, new UID: the claim was deleted and made anew
    answer = kubelet.prepare([CLAIM])[UID]
    assert f"claim default/gpu-claim (UID {UID})" in answer.error
    assert f"has UID {OTHER}: it was replaced" in answer.error and not answer.devices
    assert dra.started[0].prepared() == {}
    assert not (dra.spec_dir / claim_spec_file(UID)).exists()


def test_an_unallocated_claim_is_refused(dra: DraNode, kubelet: DraKubeletStandIn) -> None:
    dra.api.claims.put(resource_claim(UID, allocated=False))
    assert "is not allocated (status.allocation is empty)" in kubelet.prepare([CLAIM])[UID].error
    assert dra.started[0].prepared() == {}


def test_a_device_this_node_does_not_have_is_refused_by_name(
    dra: DraNode, kubelet: DraKubeletStandIn
) -> None:
    dra.api.claims.put(resource_claim(UID, results=[("gpu", "gpu-0"), ("gpu", "gpu-99")]))
    error = kubelet.prepare([CLAIM])[UID].error
    assert "allocated device(s) gpu-99 of driver gpu.nvidia.com are not on this node" in error
    assert "(it has gpu-0, gpu-1," in error
    assert not (dra.spec_dir / claim_spec_file(UID)).exists()


def test_invalid_opaque_config_for_this_driver_is_refused_and_another_drivers_is_not_ours(
    dra: DraNode, kubelet: DraKubeletStandIn
) -> None:
    theirs = {"source": "FromClaim", "opaque": {"driver": "nic.example.com", "parameters": {}}}
    ours = {"source": "FromClass", "opaque": {"driver": DRIVER_NAME, "parameters": {"kind": "GpuConfig"}}}
    dra.api.claims.put(resource_claim(UID, config=[theirs]))
    assert kubelet.prepare([CLAIM])[UID].error == ""
    dra.api.claims.put(resource_claim(OTHER, name="other", config=[theirs, ours]))
    error = kubelet.prepare([("default", "other", OTHER)])[OTHER].error
    assert (
        "status.allocation.devices.config[1] (FromClass): apiVersion None is not resource.nvidia.com/v1beta1"
        in error
    )


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (403, "HTTP 403 Forbidden: denied (the daemon's ServiceAccount needs `get` on resourceclaims"),
        (500, "HTTP 500 Internal Server Error: etcd is down"),
    ],
)
def test_api_failures_are_the_claims_error(
    dra: DraNode, kubelet: DraKubeletStandIn, status: int, expected: str
) -> None:
    dra.api.claims.failure = (status, "denied" if status == 403 else "etcd is down")
    error = kubelet.prepare([CLAIM])[UID].error
    assert "reading ResourceClaim default/gpu-claim from the API failed: " + expected in error


def test_a_deleted_claim_says_so(dra: DraNode, kubelet: DraKubeletStandIn) -> None:
    error = kubelet.prepare([CLAIM])[UID].error
    assert (
        'HTTP 404 Not Found: resourceclaims.resource.k8s.io "gpu-claim" not found (the claim was deleted)'
        in error
    )


def test_one_bad_claim_does_not_keep_the_others_of_the_call_from_being_prepared(
    dra: DraNode, kubelet: DraKubeletStandIn
) -> None:
    dra.api.claims.put(resource_claim(UID, results=[("gpu", "gpu-1")]))
    dra.api.claims.put(resource_claim(OTHER, name="broken", allocated=False))
    answer = kubelet.prepare([CLAIM, ("default", "broken", OTHER)])
    assert [d for _, _, d, _ in devices_of(answer[UID])] == ["gpu-1"]
    assert "is not allocated" in answer[OTHER].error


def test_a_refusal_is_logged_once_however_often_kubelet_retries(
    dra: DraNode, kubelet: DraKubeletStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    dra.api.claims.put(resource_claim(UID, allocated=False))
    for _ in range(3):
        assert kubelet.prepare([CLAIM])[UID].error
    assert caplog.text.count("is not allocated") == 1


def test_before_the_first_snapshot_a_claim_is_refused_until_the_devices_are_known(dra: DraNode) -> None:
    known: list[object] = []
    dra.plugin(node=lambda: dra.node if known else None)
    dra.api.claims.put(resource_claim(UID))
    with DraKubeletStandIn(dra.registry_dir) as kubelet:
        assert "this node's devices are not known yet" in kubelet.prepare([CLAIM])[UID].error
        known.append(True)
        assert kubelet.prepare([CLAIM])[UID].error == ""


def test_mig_devices_get_their_capability_nodes() -> None:
    for dra in dra_node("a100-mig-mixed"):
        mig = next(d for d in dra.node.devices.values() if d.mig is not None)
        dra.plugin()
        dra.api.claims.put(resource_claim(UID, results=[("mig", mig.name)]))
        with DraKubeletStandIn(dra.registry_dir) as kubelet:
            assert [d for _, _, d, _ in devices_of(kubelet.prepare([CLAIM])[UID])] == [mig.name]
        [device] = dra.spec(UID)["devices"]
        paths = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
        assert paths[0] == f"/dev/nvidia{mig.gpu.minor}"
        assert len(paths) == 3 and all(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in paths[1:])


def test_claims_prepared_in_parallel_are_all_recorded(dra: DraNode, kubelet: DraKubeletStandIn) -> None:
    uids = [f"0f3c6b1e-3333-4a5e-9d7e-00000000000{n}" for n in range(8)]
    for n, uid in enumerate(uids):
        dra.api.claims.put(resource_claim(uid, name=f"claim-{n}", results=[("gpu", f"gpu-{n}")]))
    answers: dict[str, str] = {}

    def prepare(n: int) -> None:
        answers[uids[n]] = kubelet.prepare([("default", f"claim-{n}", uids[n])])[uids[n]].error

    threads = [threading.Thread(target=prepare, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == dict.fromkeys(uids, "")
    assert dra.started[0].prepared() == {uid: (f"gpu-{n}",) for n, uid in enumerate(uids)}


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ([pb.Claim(namespace="default", name="c", uid="")], "claims[0].uid '' is not a UID"),
        (
            [pb.Claim(namespace="default", name="c", uid="../../etc")],
            "claims[0].uid '../../etc' is not a UID",
        ),
        (
            [pb.Claim(namespace="", name="c", uid=UID)],
            f"claims[0] (UID {UID}): namespace and name are required",
        ),
        ([pb.Claim(namespace="default", name="c", uid=UID)] * 257, "claims: 257 given, at most 256 accepted"),
    ],
)
def test_malformed_requests_are_refused_as_a_whole(
    kubelet: DraKubeletStandIn, claims: list[pb.Claim], message: str
) -> None:
    stub = kubelet.driver().stub
    for call, request in (
        (stub.NodePrepareResources, pb.NodePrepareResourcesRequest(claims=claims)),
        (stub.NodeUnprepareResources, pb.NodeUnprepareResourcesRequest(claims=claims)),
    ):
        with pytest.raises(grpc.RpcError) as raised:
            call(request, timeout=5)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert raised.value.details() == message


def test_an_undecodable_request_is_invalid_argument(dra: DraNode, kubelet: DraKubeletStandIn) -> None:
    with grpc.insecure_channel(f"unix:{dra.started[0].endpoint}") as channel:
        for version in ("v1", "v1beta1"):
            call = channel.unary_unary(
                f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodePrepareResources"
            )
            with pytest.raises(grpc.RpcError) as raised:
                call(b"\x0a\xff", timeout=5)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "undecodable NodePrepareResourcesRequest (2 bytes)" in (raised.value.details() or "")

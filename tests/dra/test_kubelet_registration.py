"""Kubelet's plugin registration of the DRA driver, through the real sockets: what GetInfo answers, the
version kubelet picks, a refusal reaching health(), and sockets served anew after they vanish."""

from __future__ import annotations

import os
from collections.abc import Iterator

import grpc
import pytest

from nvidia_device_plugin.api.pluginregistration.v1 import api_pb2 as reg_pb
from nvidia_device_plugin.dra.names import DRIVER_NAME

from support.dra_kubelet import DraKubeletStandIn, DraNode, dra_node, resource_claim
from support.waiting import wait_for

UID = "0f3c6b1e-1111-4a5e-9d7e-000000000001"


@pytest.fixture
def dra() -> Iterator[DraNode]:
    yield from dra_node()


def test_get_info_names_the_driver_its_endpoint_and_both_versions_in_order(dra: DraNode) -> None:
    dra.plugin()
    with DraKubeletStandIn(dra.registry_dir) as kubelet:
        driver = kubelet.driver()
        assert driver.socket == dra.registry_dir / "gpu.nvidia.com-reg.sock"
        assert driver.info.type == "DRAPlugin"
        assert driver.info.name == DRIVER_NAME
        assert driver.info.endpoint == str(dra.plugins_dir / "gpu.nvidia.com" / "dra.sock")
        assert list(driver.info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            # the health stream, every version kubelet may open (1.36+), newest first as kubelet prefers:
            "v1.DRAResourceHealth",
            "v1beta1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
        assert driver.version == "v1.DRAPlugin"  # kubelet takes the first it supports
        assert driver.endpoint_served  # the endpoint answered as soon as the registration was found


def test_kubelet_registration_is_recorded_and_health_is_good(dra: DraNode) -> None:
    plugin = dra.plugin()
    assert plugin.registered is None  # nothing said yet
    with DraKubeletStandIn(dra.registry_dir) as kubelet:
        kubelet.driver()
        wait_for(lambda: plugin.registered is True, "the registration status")
    assert plugin.health() is None


def test_a_kubelet_speaking_only_v1beta1_prepares_over_v1beta1(dra: DraNode) -> None:
    dra.plugin()
    dra.api.claims.put(resource_claim(UID))
    with DraKubeletStandIn(dra.registry_dir, supported=["v1beta1.DRAPlugin"]) as kubelet:
        driver = kubelet.driver()
        assert driver.version == "v1beta1.DRAPlugin"
        assert driver.messages.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1beta1"
        answer = kubelet.prepare([("default", "gpu-claim", UID)])
        assert answer[UID].error == ""
        assert [list(d.cdi_device_ids) for d in answer[UID].devices] == [
            [f"k8s.gpu.nvidia.com/claim={UID}-gpu-0"]
        ]
        assert kubelet.unprepare([("default", "gpu-claim", UID)])[UID].error == ""


def test_a_refused_registration_is_logged_and_reported_by_health(
    dra: DraNode, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = dra.plugin()
    with DraKubeletStandIn(dra.registry_dir, supported=["v2.DRAPlugin"]) as kubelet:
        assert kubelet.wait_for(lambda: bool(kubelet.refusals))
        wait_for(lambda: plugin.registered is False, "the refusal")
    problem = plugin.health()
    assert problem is not None and "kubelet refused to register the DRA driver gpu.nvidia.com" in problem
    versions = (
        "['v1.DRAPlugin', 'v1beta1.DRAPlugin', "
        "'v1.DRAResourceHealth', 'v1beta1.DRAResourceHealth', 'v1alpha1.DRAResourceHealth']"
    )
    assert f"none of the versions {versions} is supported" in problem
    assert "kubelet refused to register the DRA driver gpu.nvidia.com" in caplog.text


def test_a_deleted_registration_socket_is_served_again_and_kubelet_registers_anew(dra: DraNode) -> None:
    plugin = dra.plugin()
    with DraKubeletStandIn(dra.registry_dir) as kubelet:
        first = kubelet.driver()
        first.socket.unlink()
        assert kubelet.wait_for(lambda: first.socket.exists())
        second = kubelet.current(first.socket)
        assert second is not first and second.endpoint_served
        assert DRIVER_NAME in kubelet.deregistrations  # it saw the socket go, then a new one come
        wait_for(lambda: plugin.registered is True, "the second registration")
    assert plugin.health() is None


def test_a_deleted_endpoint_is_served_again_before_the_driver_registers_again(dra: DraNode) -> None:
    dra.plugin()
    dra.api.claims.put(resource_claim(UID))
    with DraKubeletStandIn(dra.registry_dir) as kubelet:
        kubelet.driver()
        os.unlink(dra.plugins_dir / DRIVER_NAME / "dra.sock")
        # The registration socket is made anew too, so kubelet dials the new endpoint.
        assert kubelet.wait_for(lambda: len(kubelet.registrations) >= 2)
        assert kubelet.current(dra.registry_dir / "gpu.nvidia.com-reg.sock").endpoint_served
        assert kubelet.prepare([("default", "gpu-claim", UID)])[UID].error == ""


def test_a_restarted_kubelet_finds_the_driver_again(dra: DraNode) -> None:
    dra.plugin()
    with DraKubeletStandIn(dra.registry_dir) as kubelet:
        kubelet.driver()
        kubelet.restart()
        assert kubelet.wait_for(lambda: len(kubelet.registrations) >= 2)
        assert kubelet.driver().endpoint_served


def test_a_socket_that_cannot_be_bound_is_reported_and_retried(dra: DraNode) -> None:
    endpoint = dra.plugins_dir / DRIVER_NAME / "dra.sock"
    endpoint.mkdir(parents=True)
    (endpoint / "someone's file").write_text("not ours to delete")
    plugin = dra.plugin()
    problem = plugin.health()
    assert problem is not None and f"{endpoint} is a directory where the plugin's socket must go" in problem
    assert not plugin.registration_socket.exists()  # never advertised while the endpoint does not serve
    (endpoint / "someone's file").unlink()
    with DraKubeletStandIn(dra.registry_dir) as kubelet:
        assert kubelet.driver().endpoint_served
    assert plugin.health() is None


def test_an_endpoint_that_cannot_be_served_again_withdraws_the_registration(dra: DraNode) -> None:
    plugin = dra.plugin()
    with DraKubeletStandIn(dra.registry_dir) as kubelet:
        kubelet.driver()
        plugin.endpoint.unlink()
        plugin.endpoint.mkdir()
        (plugin.endpoint / "someone's file").write_text("")
        assert kubelet.wait_for(lambda: not kubelet.drivers)  # kubelet saw the registration socket go
        assert not plugin.registration_socket.exists()
        problem = plugin.health()
        assert problem is not None and f"{plugin.endpoint} is a directory" in problem
        (plugin.endpoint / "someone's file").unlink()
        assert kubelet.driver().endpoint_served
        wait_for(lambda: plugin.health() is None, "health after the endpoint is served again")


def test_stop_removes_both_sockets_and_kubelet_deregisters(dra: DraNode) -> None:
    plugin = dra.plugin()
    with DraKubeletStandIn(dra.registry_dir) as kubelet:
        kubelet.driver()
        plugin.stop()
        assert kubelet.wait_for(lambda: not kubelet.drivers)
    assert not plugin.registration_socket.exists() and not plugin.endpoint.exists()
    assert plugin.health() == "the DRA kubelet plugin of gpu.nvidia.com is not running"


def test_malformed_registration_calls_are_invalid_argument(dra: DraNode) -> None:
    plugin = dra.plugin()
    with grpc.insecure_channel(f"unix:{plugin.registration_socket}") as channel:
        call = channel.unary_unary("/pluginregistration.Registration/GetInfo", None, None)
        with pytest.raises(grpc.RpcError) as raised:
            call(b"\xff\xff\xff", timeout=5)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        info = reg_pb.PluginInfo.FromString(call(b"", timeout=5))
        assert info.name == DRIVER_NAME

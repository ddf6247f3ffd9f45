"""Kubelet's pod-resources API stand-in: `List` over a real unix socket, answering what the test says
running pods hold (device-plugin IDs by resource, DRA devices of their claims)."""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc

from nvidia_device_plugin.api.podresources.v1 import api_pb2 as pb
from nvidia_device_plugin.api.podresources.v1 import api_pb2_grpc as pb_grpc


class PodResourcesStandIn(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.lock = threading.Lock()
        self.plugin: dict[str, tuple[str, list[str]]] = {}  # pod -> (resource, device IDs)
        self.claims: dict[str, list[tuple[str, str, str]]] = {}  # pod -> [(driver, pool, device)]
        self.calls = 0
        self.failing = False  # answer UNAVAILABLE, as a kubelet that is restarting
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{socket}")

    def List(
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        with self.lock:
            self.calls += 1
            if self.failing:
                context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is restarting")
            pods = []
            for pod, (resource, ids) in self.plugin.items():
                devices = [pb.ContainerDevices(resource_name=resource, device_ids=ids)]
                pods.append(pb.PodResources(name=pod, namespace="default", containers=[
                    pb.ContainerResources(name="c", devices=devices)
                ]))  # fmt: skip
            for pod, claimed in self.claims.items():
                resources = [
                    pb.ClaimResource(driver_name=d, pool_name=p, device_name=n) for d, p, n in claimed
                ]
                dynamic = [
                    pb.DynamicResource(claim_name=pod, claim_namespace="default", claim_resources=resources)
                ]
                pods.append(pb.PodResources(name=pod, namespace="default", containers=[
                    pb.ContainerResources(name="c", dynamic_resources=dynamic)
                ]))  # fmt: skip
        return pb.ListPodResourcesResponse(pod_resources=pods)

    def __enter__(self) -> PodResourcesStandIn:
        self._server.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.stop(grace=None)

"""Kubelet's pod-resources API stand-in: `List` over a real unix socket, answering what the test says
running pods hold (device-plugin IDs by resource, DRA devices of their claims). Its socket looks an hour
old, as a kubelet that has been up for a while; `restart` replaces it with a new one, as kubelet does when
it starts again."""

from __future__ import annotations

import os
import threading
import time
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
        self.restoring = False  # answer that no pod holds anything, as a kubelet whose pods are not back
        self._server = self._new_server()

    def _new_server(self) -> grpc.Server:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        return server

    def restart(self) -> None:
        """Serve from a new socket at the same path (a new inode and mtime), as a restarted kubelet."""
        self._server.stop(grace=None)
        self.socket.unlink(missing_ok=True)
        self._server = self._new_server()
        self._server.start()

    def List(
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        with self.lock:
            self.calls += 1
            if self.failing:
                context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is restarting")
            if self.restoring:
                return pb.ListPodResourcesResponse(pod_resources=[])
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
        an_hour_ago = time.time() - 3600
        os.utime(self.socket, (an_hour_ago, an_hour_ago))
        return self

    def __exit__(self, *_: object) -> None:
        self._server.stop(grace=None)

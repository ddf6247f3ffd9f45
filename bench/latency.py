"""Allocate and GetPreferredAllocation latency over the daemon's unix sockets, beside a bare grpcio server
answering the same requests (the floor), interleaved in chunks so that drift hits both alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from bench.figures import Figure, figure, p99_within
from bench.procs import BenchError, daemon_process, echo_server
from bench.sampling import Budget, in_ms, interleaved
from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.api.v1beta1 import api_pb2_grpc as pb_grpc
from nvidia_device_plugin.serving.backend import PREFERRED_REST

GPU = "nvidia.com/gpu"
MIG_1G = "nvidia.com/mig-1g.10gb"
FLOOR = "bare grpcio"


def spread(ids: Sequence[str], n: int, physical: int) -> list[str]:
    """n IDs on n different physical devices where the resource has replicas (IDs are in physical order)."""
    stride = max(1, len(ids) // physical)
    return list(ids[::stride][:n])


def allocate_latency(budget: Budget) -> list[Figure]:
    figures: list[Figure] = []
    cases = (
        (None, "whole", "of 8 whole GPUs"),
        ("time-slicing-100", "replicas", "of 800 time-sliced replicas"),
    )
    with echo_server() as echo, grpc.insecure_channel(f"unix:{echo.socket}") as channel:
        floor = pb_grpc.DevicePluginStub(channel)
        for config, key, label in cases:
            with daemon_process("dgx-a100", config) as daemon:
                ids = [d.id for d in daemon.plans[0].devices]
                stub = daemon.kubelet.plugin(GPU).stub
                for n in (1, 2, 8):
                    chosen = spread(ids, n, 8)
                    request = pb.AllocateRequest(
                        container_requests=[pb.ContainerAllocateRequest(devices_ids=chosen)]
                    )
                    response = stub.Allocate(request, timeout=5)
                    visible = response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"]
                    if len(visible.split(",")) != n:
                        raise BenchError(f"Allocate of {chosen} answered NVIDIA_VISIBLE_DEVICES={visible}")

                    def ours(request: pb.AllocateRequest = request, stub: Any = stub) -> object:
                        return stub.Allocate(request, timeout=5)

                    def bare(request: pb.AllocateRequest = request) -> object:
                        return floor.Allocate(request, timeout=5)

                    interleaved([ours, bare], budget.warmup)
                    plugin_s, floor_s = interleaved([ours, bare], budget.allocate_calls)
                    figures.append(
                        figure(
                            f"allocate.{key}.{n}",
                            f"Allocate {n} {label}",
                            "ms",
                            in_ms(plugin_s),
                            (f"{FLOOR} Allocate", in_ms(floor_s)),
                            p99_within(3),
                        )
                    )
    return figures


_PACED_NOTE = (
    "each GetPreferredAllocation after the plugin's rest between computations, at kubelet's pace "
    "(back-to-back calls are paced on purpose: contention.preferred_flood)"
)


def preferred_latency(budget: Budget) -> list[Figure]:
    figures: list[Figure] = []
    cases = (
        ("nvswitch-16", None, GPU, 8, "8 of 16 GPUs on NVSwitch", budget.preferred_calls),
        ("mixed-nvlink-16", None, GPU, 8, "8 of 16 GPUs, mixed NVLink", budget.preferred_calls),
        ("dgx-a100", "time-slicing-100", GPU, 4, "4 of 800 replicas", budget.preferred_calls),
        (
            "a100-8x7-mig",
            "mig-1g-time-slicing-100",
            MIG_1G,
            4,
            "4 of 5,600 MIG replicas",
            budget.preferred_calls // 5,
        ),
    )
    with echo_server() as echo, grpc.insecure_channel(f"unix:{echo.socket}") as channel:
        floor = pb_grpc.DevicePluginStub(channel)
        for node, config, resource, size, label, calls in cases:
            with daemon_process(node, config) as daemon:
                plan = next(p for p in daemon.plans if p.name == resource)
                request = pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(
                            available_deviceIDs=[d.id for d in plan.devices], allocation_size=size
                        )
                    ]
                )
                stub = daemon.kubelet.plugin(resource).stub
                answer = stub.GetPreferredAllocation(request, timeout=30)
                if len(answer.container_responses[0].deviceIDs) != size:
                    raise BenchError(f"GetPreferredAllocation {label} answered {answer}")

                def ours(request: pb.PreferredAllocationRequest = request, stub: Any = stub) -> object:
                    return stub.GetPreferredAllocation(request, timeout=30)

                def bare(request: pb.PreferredAllocationRequest = request) -> object:
                    return floor.GetPreferredAllocation(request, timeout=30)

                # Each call after the rest the plugin takes between computations (PREFERRED_REST x the
                # last one), as kubelet's calls come, one per container admitted: back-to-back calls are
                # paced on purpose, and measured so they would time the pacing, not the answer.
                paced = PREFERRED_REST + 1.0
                interleaved([ours, bare], min(budget.warmup, max(1, calls)), rest=paced)
                plugin_s, floor_s = interleaved([ours, bare], max(1, calls), chunk=10, rest=paced)
                figures.append(
                    figure(
                        f"preferred.{node}.{size}",
                        f"GetPreferredAllocation {label}",
                        "ms",
                        in_ms(plugin_s),
                        (f"{FLOOR} GetPreferredAllocation", in_ms(floor_s)),
                        note=_PACED_NOTE if not figures else "",
                    )
                )
    return figures

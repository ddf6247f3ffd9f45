"""The floor: a bare grpcio DevicePlugin server that answers Allocate and GetPreferredAllocation with empty
responses. Same generated stubs, same thread pool size and message limits as the plugin's ResourceServer,
so a round trip to it is what gRPC itself costs. Run as `python -m bench.echo_server SOCKET`; it prints
"ready" once serving and stops on SIGTERM.

`--floor` (and `--floor=config`) adds what any device plugin built on this project's dependencies must
do, with none of the plugin's own code. Before "ready": import pynvml (with ctypes), argparse and
dataclasses, and make one client call (kubelet's Register) to its own socket; `config` adds PyYAML's parse
of a small document. After "ready", as the plugin does once registered: watch the socket's directory with
watchdog (kubelet's restarts, as the device-plugin API asks), and with `config` a second directory (the
config file's). The bench reports this beside the bare server: what is left between the two is the budget
the plugin's own code has under a target set against the bare server.
"""

from __future__ import annotations

import signal
import sys
import threading
from concurrent import futures
from types import FrameType
from typing import TYPE_CHECKING

import grpc

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.api.v1beta1 import api_pb2_grpc as pb_grpc
from nvidia_device_plugin.plugin.protocol import MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES

if TYPE_CHECKING:
    from watchdog.observers.api import BaseObserver


class EchoServicer(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions()

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        return pb.AllocateResponse()

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        return pb.PreferredAllocationResponse()


def serve(socket: str) -> grpc.Server:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="echo"),
        options=[
            ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
            ("grpc.max_send_message_length", MAX_RESPONSE_BYTES),
        ],
    )
    pb_grpc.add_DevicePluginServicer_to_server(EchoServicer(), server)
    server.add_insecure_port(f"unix:{socket}")
    server.start()
    return server


def floor(socket: str, config: bool) -> None:
    """The dependencies' share of a plugin's start before kubelet sees it (see the module's docstring)."""
    import argparse  # noqa: F401 - imported for its cost: every daemon parses flags
    import dataclasses  # noqa: F401 - the plugin's data types are dataclasses

    import pynvml  # noqa: F401 - the NVML boundary

    if config:
        import yaml

        yaml.load("version: v1\nflags:\n  migStrategy: none\n", Loader=yaml.CSafeLoader)
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(pb.Empty(), timeout=10)


def floor_watches(socket: str, config: bool) -> list[BaseObserver]:
    """The watches a plugin makes once registered (see the module's docstring); stopped by the caller."""
    from pathlib import Path

    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    observers = []
    for directory in [Path(socket).parent] * (2 if config else 1):
        observer = Observer()
        observer.schedule(FileSystemEventHandler(), str(directory))
        observer.start()
        observers.append(observer)
    return observers


def main(argv: list[str]) -> int:
    modes = {"--floor": False, "--floor=config": True}  # with a config file, or not
    if len(argv) not in (1, 2) or (len(argv) == 2 and argv[0] not in modes):
        print("usage: python -m bench.echo_server [--floor | --floor=config] SOCKET", file=sys.stderr)
        return 2
    socket, config = argv[-1], modes.get(argv[0]) if len(argv) == 2 else None
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = serve(socket)
    if config is not None:
        floor(socket, config)
    print("ready", flush=True)
    kept = floor_watches(socket, config) if config is not None else []
    while not stop.wait(3600):
        pass
    for observer in kept:
        observer.stop()
    server.stop(0).wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

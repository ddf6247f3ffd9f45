"""The floor: a bare grpcio DevicePlugin server that answers Allocate and GetPreferredAllocation with empty
responses. Same generated stubs, same thread pool size and message limits as the plugin's ResourceServer,
so a round trip to it is what gRPC itself costs. Run as `python -m bench.echo_server SOCKET`; it prints
"ready" once serving and stops on SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import threading
from concurrent import futures
from types import FrameType

import grpc

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.api.v1beta1 import api_pb2_grpc as pb_grpc
from nvidia_device_plugin.plugin.protocol import MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES


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


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.echo_server SOCKET", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = serve(argv[0])
    print("ready", flush=True)
    while not stop.wait(3600):
        pass
    server.stop(0).wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

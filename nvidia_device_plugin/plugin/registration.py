"""The Register call to kubelet."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.api.v1beta1 import api_pb2_grpc as pb_grpc
from nvidia_device_plugin.plugin.protocol import PLUGIN_OPTIONS

API_VERSION = "v1beta1"
# Kubelet answers Register only after dialling the plugin's socket back (its own dial timeout is 10 s)
# and calling GetDevicePluginOptions. Waiting less makes a slow kubelet look like a failure: the retry
# registers again and the first registration was already made.
REGISTER_TIMEOUT_SECONDS = 15.0
# How often a Register call in flight looks at the stop flag, so that stopping never waits the full timeout.
_STOP_CHECK_SECONDS = 0.1


class RegistrationError(Exception):
    pass


def register(
    kubelet_socket: Path,
    resource_name: str,
    endpoint: str,
    stop: threading.Event,
    timeout: float = REGISTER_TIMEOUT_SECONDS,
) -> None:
    """One Register call to kubelet; raises RegistrationError with kubelet's reason (or "stopping")."""
    request = pb.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=PLUGIN_OPTIONS,
    )
    with grpc.insecure_channel(f"unix:{kubelet_socket}") as channel:
        # No wait_for_ready: gRPC's reconnect backoff starts at a second; our own retry loop is faster.
        call = pb_grpc.RegistrationStub(channel).Register.future(request, timeout=timeout)
        answered = threading.Event()
        call.add_done_callback(lambda _: answered.set())
        while not answered.wait(_STOP_CHECK_SECONDS):
            if stop.is_set():
                call.cancel()
                raise RegistrationError("stopping")
        try:
            call.result()
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise RegistrationError(f"{code.name if code else 'error'}: {details}") from exc

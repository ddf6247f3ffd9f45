"""A gRPC server on one unix socket, that knows whether its socket file is still the one it listens on.

Kubelet (or an operator cleaning up) may delete a socket under a running server; the server then still
runs but nobody can reach it. `intact()` compares the file's inode with the one bound, and the plugin's
supervisor serves anew (`restart()`) where it is not. Making room for the socket and the bind errors are
the device-plugin framework's (plugin/server.py), so both kinds of socket behave alike.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path

import grpc
from google.protobuf.message import Message

from nvidia_device_plugin.plugin.server import BindError, clear_socket_path

# Kubelet calls one claim batch at a time per pod; a few workers serve several pods starting at once.
WORKERS = 4
MAX_CONCURRENT_CALLS = 32  # more are answered RESOURCE_EXHAUSTED at once instead of queueing without bound


class UnixServer:
    """Serves `handlers` on `path` between start() and stop(); start() again after stop() is allowed."""

    def __init__(
        self,
        name: str,
        path: Path,
        handlers: Sequence[grpc.GenericRpcHandler[bytes, Message]],
        max_request_bytes: int,
        max_response_bytes: int,
    ) -> None:
        self.name = name
        self.path = path
        self._handlers = tuple(handlers)
        self._options = [
            ("grpc.max_receive_message_length", max_request_bytes),
            ("grpc.max_send_message_length", max_response_bytes),
        ]
        self._server: grpc.Server | None = None
        self._inode: int | None = None

    def start(self) -> None:
        """Listen on the socket; BindError naming the path (nothing left running) when that fails."""
        if self._server is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BindError(f"cannot create {self.path.parent}: {exc.strerror or exc}") from None
        clear_socket_path(self.path)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix=f"grpc-{self.name}"),
            options=self._options,
            maximum_concurrent_rpcs=MAX_CONCURRENT_CALLS,
        )
        server.add_generic_rpc_handlers(self._handlers)
        try:
            server.add_insecure_port(f"unix:{self.path}")
            server.start()
            self._inode = self.path.stat().st_ino  # the file may already be gone again: then BindError
        except Exception as exc:
            server.stop(None)
            raise BindError(f"cannot listen on {self.path}: {exc}") from None
        self._server = server

    def intact(self) -> bool:
        """Whether the server runs and its socket file is the one it bound."""
        try:
            return self._server is not None and self.path.stat().st_ino == self._inode
        except OSError:
            return False

    def stop(self, grace: float = 0.5) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.stop(grace).wait()
        with contextlib.suppress(OSError):
            if self.path.is_socket() and self.path.stat().st_ino == self._inode:
                os.unlink(self.path)  # ours only: a socket someone made there since is left alone

    def restart(self) -> None:
        """Serve anew on a fresh socket file (the old one is gone or replaced)."""
        self.stop(grace=0)
        self.start()

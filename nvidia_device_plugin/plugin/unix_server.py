"""A gRPC server on one unix socket that knows whether its socket file is still the one it listens on.

Kubelet (or an operator cleaning up) may delete a socket under a running server; the server then still
runs but nobody can reach it. `intact()` compares the file's inode with the one bound, and whoever owns
the server serves anew (`restart()`) where it is not. The device plugin's resource servers
(plugin/server.py) and the DRA kubelet plugin's two sockets (dra/kubelet/plugin.py) are all this server,
so every socket makes room for itself, fails to bind and cleans up alike.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path

import grpc
from google.protobuf.message import Message

from nvidia_device_plugin.base.errors import DevicePluginError

log = logging.getLogger(__name__)


class BindError(DevicePluginError):
    """The server cannot listen on its socket path; the message names the path and why."""


def clear_socket_path(path: Path) -> None:
    """Make room for the socket: a stale socket or file is removed, so is an empty directory.

    A non-empty directory is someone's data, never ours to delete: BindError, and the caller retries.
    """
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise BindError(f"cannot inspect {path}: {exc.strerror or exc}") from None
    try:
        if stat.S_ISDIR(mode):
            path.rmdir()
            log.warning("removed the empty directory %s, which stood where the socket must go", path)
        else:
            path.unlink(missing_ok=True)
    except FileNotFoundError:
        return  # removed by someone else meanwhile: the room is made
    except OSError as exc:
        what = "a directory" if stat.S_ISDIR(mode) else "a file"
        raise BindError(
            f"{path} is {what} where the plugin's socket must go and cannot be removed "
            f"({exc.strerror or exc}); remove it"
        ) from None


class UnixServer:
    """Serves `handlers` on `path` between start() and stop(); start() again after stop() is allowed.

    `workers` threads answer at most `max_calls` calls at once (running or queued); more get
    RESOURCE_EXHAUSTED at once instead of queueing without bound. `make_parent`: create the socket's
    directory (the DRA plugin's own); without it a missing directory is a BindError (the device-plugin
    directory is kubelet's, and the registrar waits for it).
    """

    def __init__(
        self,
        name: str,
        path: Path,
        handlers: Sequence[grpc.GenericRpcHandler[bytes, Message]],
        max_request_bytes: int,
        max_response_bytes: int,
        *,
        workers: int,
        max_calls: int,
        make_parent: bool = False,
    ) -> None:
        self.name = name
        self.path = path
        self._handlers = tuple(handlers)
        self._options = [
            ("grpc.max_receive_message_length", max_request_bytes),
            ("grpc.max_send_message_length", max_response_bytes),
        ]
        self._workers = workers
        self._max_calls = max_calls
        self._make_parent = make_parent
        self._server: grpc.Server | None = None
        self._inode: int | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        """Listen on the socket; BindError naming the path (nothing left running) when that fails."""
        if self._server is not None:
            return
        if self._make_parent:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise BindError(f"cannot create {self.path.parent}: {exc.strerror or exc}") from None
        clear_socket_path(self.path)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix=f"grpc-{self.name}"),
            options=self._options,
            maximum_concurrent_rpcs=self._max_calls,
        )
        server.add_generic_rpc_handlers(self._handlers)
        try:
            server.add_insecure_port(f"unix:{self.path}")
            server.start()
            # Kubelet restarting right now may already have deleted the socket just bound: then BindError.
            self._inode = self.path.stat().st_ino
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

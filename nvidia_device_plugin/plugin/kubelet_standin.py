"""A kubelet stand-in: the Registration service on kubelet.sock plus the device-manager side of the
DevicePlugin protocol (dial back, ListAndWatch, GetPreferredAllocation, Allocate), over real unix sockets.

Used by `demo`, the tests and the benchmarks, so the plugin is always exercised the way kubelet does it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.api.v1beta1 import api_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "kubelet_internal_checkpoint"


@dataclass
class PluginEndpoint:
    """What the stand-in knows about one registered resource."""

    resource: str
    endpoint: str
    options: pb.DevicePluginOptions
    channel: grpc.Channel
    stub: pb_grpc.DevicePluginStub
    devices: dict[str, pb.Device] = field(default_factory=dict)
    updates: int = 0  # ListAndWatch messages received
    last_update: float = 0.0  # time.perf_counter() of the last one
    stream: object | None = None
    watching: bool = False  # its ListAndWatch stream is open
    allocated: set[str] = field(default_factory=set)


class _Registration(pb_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, kubelet: KubeletStandIn) -> None:
        self._kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        reason = self._kubelet._register(request)
        if reason:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason)
        return pb.Empty()


class KubeletStandIn:
    """Start with start(); restart() behaves like a kubelet restart (sockets wiped, kubelet.sock anew)."""

    def __init__(
        self,
        plugin_dir: Path,
        reject: Callable[[pb.RegisterRequest], str | None] | None = None,
        register_delay: float = 0.0,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.socket = plugin_dir / "kubelet.sock"
        self.reject = reject
        # Seconds Register takes to answer after the dial-back, as a busy kubelet can.
        self.register_delay = register_delay
        self.registrations: list[pb.RegisterRequest] = []
        self._plugins: dict[str, PluginEndpoint] = {}
        # Endpoints replaced by a newer registration of their resource. Like kubelet, the stand-in does not
        # close them: ending their streams is the plugin's job.
        self.superseded: list[PluginEndpoint] = []
        self._changed = threading.Condition()
        self._server: grpc.Server | None = None

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet-standin"))
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix:{self.socket}")
        server.start()
        self._server = server

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(0).wait()
        self.socket.unlink(missing_ok=True)
        with self._changed:
            plugins = list(self._plugins.values()) + self.superseded
            self._plugins.clear()
            self.superseded = []
            self._changed.notify_all()
        for plugin in plugins:
            plugin.channel.close()

    def restart(self) -> None:
        """What kubelet does when it restarts: forget plugins, wipe the directory, listen again."""
        self.stop()
        for entry in self.plugin_dir.iterdir():
            if entry.name != CHECKPOINT_FILE and (entry.is_socket() or entry.is_symlink()):
                entry.unlink(missing_ok=True)
        self.start()

    def __enter__(self) -> KubeletStandIn:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- registration and ListAndWatch -------------------------------------------------------

    def _register(self, request: pb.RegisterRequest) -> str | None:
        self.registrations.append(request)
        if request.version != "v1beta1":
            return f"unsupported device plugin API version {request.version!r}"
        if "/" not in request.resource_name:
            return f"invalid resource name {request.resource_name!r}: must be <domain>/<name>"
        if self.reject is not None and (reason := self.reject(request)):
            return reason
        channel = grpc.insecure_channel(f"unix:{self.plugin_dir / request.endpoint}")
        stub = pb_grpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        except grpc.RpcError as exc:
            channel.close()
            return f"cannot dial back plugin at {request.endpoint}: {exc}"
        plugin = PluginEndpoint(
            request.resource_name, request.endpoint, options, channel, stub, watching=True
        )
        with self._changed:
            old = self._plugins.get(request.resource_name)
            self._plugins[request.resource_name] = plugin
            if old is not None:
                self.superseded.append(old)
            self._changed.notify_all()
        threading.Thread(
            target=self._watch, args=(plugin,), name=f"kubelet-law-{request.resource_name}"
        ).start()
        if self.register_delay > 0:
            time.sleep(self.register_delay)
        return None

    def _watch(self, plugin: PluginEndpoint) -> None:
        try:
            stream = plugin.stub.ListAndWatch(pb.Empty())
            plugin.stream = stream
            for response in stream:
                with self._changed:
                    plugin.devices = {d.ID: d for d in response.devices}
                    plugin.updates += 1
                    plugin.last_update = time.perf_counter()
                    self._changed.notify_all()
        except (grpc.RpcError, ValueError):
            # The plugin or the stand-in went away (ValueError: the stand-in closed the channel before
            # the stream opened, when it restarts quickly); a new registration opens a new stream.
            pass
        finally:
            with self._changed:
                plugin.watching = False
                done = plugin in self.superseded
                if done:  # nobody will use it again: the list stays as long as the open streams
                    self.superseded.remove(plugin)
                self._changed.notify_all()
            if done:
                plugin.channel.close()

    # ---- what a test or the demo asks -------------------------------------------------------

    def plugin(self, resource: str) -> PluginEndpoint:
        with self._changed:
            return self._plugins[resource]

    def resources(self) -> list[str]:
        with self._changed:
            return sorted(self._plugins)

    def devices(self, resource: str) -> dict[str, pb.Device]:
        with self._changed:
            plugin = self._plugins.get(resource)
            return dict(plugin.devices) if plugin else {}

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Wait until predicate() (evaluated under the stand-in's lock) holds; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(timeout=min(left, 0.1))
            return True

    def wait_for_resources(self, names: Sequence[str], timeout: float = 10.0) -> bool:
        return self.wait_for(
            lambda: all(n in self._plugins and self._plugins[n].updates > 0 for n in names), timeout
        )

    def allocate(
        self, resource: str, containers: Sequence[Sequence[str]], timeout: float = 5.0
    ) -> pb.AllocateResponse:
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in containers]
        )
        response: pb.AllocateResponse = self.plugin(resource).stub.Allocate(request, timeout=timeout)
        return response

    def preferred(
        self,
        resource: str,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        timeout: float = 5.0,
    ) -> list[str]:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size
                )
            ]
        )
        response = self.plugin(resource).stub.GetPreferredAllocation(request, timeout=timeout)
        return list(response.container_responses[0].deviceIDs)

    def admit(self, resource: str, count: int) -> tuple[list[str], pb.ContainerAllocateResponse]:
        """Admit a one-container pod asking for `count` devices, as kubelet's device manager would."""
        plugin = self.plugin(resource)
        with self._changed:
            free = sorted(
                d.ID
                for d in plugin.devices.values()
                if d.health == "Healthy" and d.ID not in plugin.allocated
            )
        if len(free) < count:
            raise RuntimeError(f"{resource}: {count} requested, {len(free)} healthy devices free")
        chosen = free[:count]
        if plugin.options.get_preferred_allocation_available:
            chosen = self.preferred(resource, free, [], count)
        response = self.allocate(resource, [chosen])
        with self._changed:
            plugin.allocated.update(chosen)
        return chosen, response.container_responses[0]

"""A kubelet stand-in: the Registration service on kubelet.sock plus the device-manager side of the
DevicePlugin protocol (dial back, ListAndWatch, GetPreferredAllocation, Allocate), over real unix sockets.

Used by `demo`, the tests and the benchmarks, so the plugin is always exercised the way kubelet does it.
It follows kubelet's (v1.36) device-plugin server where a plugin can see the difference:

* Register (connectClient): the new client first replaces the resource's client, then kubelet dials the
  endpoint and asks GetDevicePluginOptions. When that fails the client is dropped, and with it the live
  registration it replaced, while the devices stay as they were ("Healthy" for a plugin that may be dead):
  a plugin must never Register before its socket serves.
* Each client runs one ListAndWatch stream (runClient). When the stream ends, kubelet looks up the
  resource's *current* client and disconnects that one: closes its channel, marks every device of the
  resource Unhealthy, stamps the endpoint's stop time. After a quick re-registration that is the new client
  (kubelet's disconnect race). Kubelet never dials a plugin again: only a new Register brings it back.
* kill() leaves a dead kubelet.sock (Register is refused) until the next start(); start() deletes every
  socket in the directory first, then listens on kubelet.sock anew. restart() is kill() then start(). A
  Register the killed kubelet was still handling changes nothing after it died (its process is gone).
* Capacity, allocatable, expired resources and admission: kubelet_devices.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import grpc

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.api.v1beta1 import api_pb2_grpc as pb_grpc
from nvidia_device_plugin.base.workers import Worker, wait_under
from nvidia_device_plugin.standins.kubelet_devices import (
    ENDPOINT_STOP_GRACE_S,
    NODE_STATUS_INTERVAL_S,
    ResourceState,
    TopologyPolicy,
    admit_container,
    node_status_tick,
    preferred_request,
    rpc_failure,
    unexpected,
)

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "kubelet_internal_checkpoint"
DIAL_TIMEOUT_S = 10.0  # kubelet's dial timeout towards a plugin's socket
# How long a caller's wait (wait_for and friends) and a call to the plugin (allocate, preferred) may take
# unless it says otherwise: they only turn a hang into a failure. The suite scales both to its machine.
WAIT_S = 10.0
CALL_S = 5.0


@dataclass
class PluginEndpoint:
    """One registration: kubelet's client of the plugin's socket, and the endpoint made from it."""

    resource: str
    endpoint: str
    channel: grpc.Channel
    stub: pb_grpc.DevicePluginStub
    generation: int  # of the kubelet (start) that made it
    options: pb.DevicePluginOptions = field(default_factory=pb.DevicePluginOptions)
    updates: int = 0  # ListAndWatch messages received
    last_update: float = 0.0  # time.perf_counter() of the last one
    stream: grpc.RpcContext | None = None  # the ListAndWatch call, once open
    watching: bool = False  # its ListAndWatch stream is open
    dialled: bool = False  # its channel is connected (kubelet's client has a grpc connection to close)


NOT_RUNNING = "connection refused: kubelet is not running"


class _Registration(pb_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, kubelet: KubeletStandIn) -> None:
        self._kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        generation = self._kubelet.running_generation()
        if generation is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, NOT_RUNNING)
        reason = self._kubelet._register(request, generation)
        if reason == NOT_RUNNING:
            context.abort(grpc.StatusCode.UNAVAILABLE, reason)
        if reason:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason)
        return pb.Empty()


class KubeletStandIn:
    """Start with start(); restart() behaves like a kubelet that was killed and started again."""

    def __init__(
        self,
        plugin_dir: Path,
        reject: Callable[[pb.RegisterRequest], str | None] | None = None,
        *,
        register_hold: Callable[[], None] | None = None,
        topology_policy: TopologyPolicy = "none",
        node_status_interval: float = NODE_STATUS_INTERVAL_S,
        endpoint_stop_grace: float = ENDPOINT_STOP_GRACE_S,
        disconnect_delay: float = 0.0,
        watch: bool = True,
        wait_s: float = WAIT_S,
        call_s: float = CALL_S,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.socket = plugin_dir / "kubelet.sock"
        self.reject = reject
        # Called after the dial-back, before Register answers: a busy kubelet's delay (a sleep), or a test
        # holding the answer until its own condition.
        self.register_hold = register_hold
        self.topology_policy = topology_policy
        self.node_status_interval = node_status_interval
        self.endpoint_stop_grace = endpoint_stop_grace
        # Seconds between a stream's end and runClient looking up whom to disconnect (a busy kubelet's
        # goroutine): widens the window of the disconnect race.
        self.disconnect_delay = disconnect_delay
        self.watch = watch  # False: a kubelet whose clients never open their ListAndWatch stream
        self.wait_s, self.call_s = wait_s, call_s  # the default budgets of waits and of calls to a plugin
        self.registrations: list[pb.RegisterRequest] = []
        self.dial_failures: list[str] = []  # endpoints named by a Register that could not be dialled
        self.disconnects: list[str] = []  # resources disconnected (marked Unhealthy), in order
        self.ticks = 0  # node-status ticks so far
        self.dead = False  # killed: kubelet.sock is still there but nothing answers
        self._clients: dict[str, PluginEndpoint] = {}  # the plugin server's current client per resource
        self._plugins: dict[str, PluginEndpoint] = {}  # the device manager's endpoint per resource
        self._resources: dict[str, ResourceState] = {}  # survives restarts, as kubelet's checkpoint does
        # Clients replaced by a newer registration whose streams are still open. Like kubelet, the stand-in
        # does not close them.
        self.superseded: list[PluginEndpoint] = []
        self._generation = 0
        self._changed = threading.Condition()
        self._server: grpc.Server | None = None
        self._status: Worker | None = None

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Kubelet's start-up: every socket in the directory is deleted, then kubelet.sock listens anew."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._stop_server()
        for entry in self.plugin_dir.iterdir():
            if entry.name != CHECKPOINT_FILE and (entry.is_socket() or entry.is_symlink()):
                entry.unlink(missing_ok=True)
        with self._changed:
            self._generation += 1
            self.dead = False
            now = time.monotonic()
            for state in self._resources.values():  # from the checkpoint: 0 devices until re-registered
                state.devices = {}
                state.stopped_at = now
            self._changed.notify_all()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet-standin"))
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix:{self.socket}")
        server.start()
        self._server = server
        self._status = Worker("kubelet-node-status", self._tick_until)
        self._status.start()

    def kill(self) -> None:
        """What SIGKILL leaves: every client connection gone, a dead kubelet.sock left behind."""
        with self._changed:
            self.dead = True
            clients = self._forget_clients()
            status, self._status = self._status, None
        if status is not None:
            status.stop()
        for client in clients:
            client.channel.close()

    def stop(self) -> None:
        """A clean stop (the end of a test): connections closed, kubelet.sock removed."""
        self.kill()
        self._stop_server()
        self.socket.unlink(missing_ok=True)

    def restart(self) -> None:
        """A kubelet killed and started again: connections gone, then the directory wiped, then listening."""
        self.kill()
        self.start()

    def _forget_clients(self) -> list[PluginEndpoint]:
        """Under the lock: drop every client and endpoint (the process that held them is gone)."""
        clients = [*self._clients.values(), *self._plugins.values(), *self.superseded]
        self._clients.clear()
        self._plugins.clear()
        self.superseded = []
        self._changed.notify_all()
        return list({id(c): c for c in clients}.values())

    def _stop_server(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(0).wait()

    def __enter__(self) -> KubeletStandIn:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- registration and ListAndWatch -------------------------------------------------------

    def running_generation(self) -> int | None:
        """The running kubelet's start (a Register belongs to it); None while killed."""
        with self._changed:
            return None if self.dead else self._generation

    def _gone(self, generation: int) -> bool:
        """Whether the kubelet of `generation` has died since (`_changed` held)."""
        return generation != self._generation or self.dead

    def _register(self, request: pb.RegisterRequest, generation: int) -> str | None:
        """Kubelet's Register handler, for the kubelet of `generation`. A handler still running when that
        kubelet was killed (its thread cannot be stopped here) changes nothing after: the process that ran
        it is gone, so the next kubelet's clients are not its to replace or drop."""
        self.registrations.append(request)
        if request.version != "v1beta1":
            return f"unsupported device plugin API version {request.version!r}"
        if "/" not in request.resource_name:
            return f"invalid resource name {request.resource_name!r}: must be <domain>/<name>"
        if self.reject is not None and (reason := self.reject(request)):
            return reason
        name = request.resource_name
        channel = grpc.insecure_channel(f"unix:{self.plugin_dir / request.endpoint}")
        client = PluginEndpoint(name, request.endpoint, channel, pb_grpc.DevicePluginStub(channel), 0)
        with self._changed:
            if self._gone(generation):
                channel.close()
                return NOT_RUNNING
            client.generation = generation
            old = self._clients.get(name)
            self._clients[name] = client  # registerClient, before the dial
            if old is not None and old.watching:
                self.superseded.append(old)
        try:
            client.options = client.stub.GetDevicePluginOptions(pb.Empty(), timeout=DIAL_TIMEOUT_S)
            client.dialled = True
        except (grpc.RpcError, ValueError) as exc:
            with self._changed:
                if generation == self._generation:
                    self._clients.pop(name, None)  # deregisterClient: by name, whoever is there now
                    self.dial_failures.append(request.endpoint)
                self._changed.notify_all()
            channel.close()
            why = rpc_failure(exc) if isinstance(exc, grpc.RpcError) else str(exc)
            return f"cannot dial back plugin at {request.endpoint}: {why}"
        if not self._connected(client, generation):
            channel.close()
            return NOT_RUNNING
        if self.watch:
            threading.Thread(
                target=self._run_client, args=(client,), name=f"kubelet-law-{name}", daemon=True
            ).start()
        if self.register_hold is not None:
            self.register_hold()
        return None

    def _connected(self, client: PluginEndpoint, generation: int) -> bool:
        """PluginConnected: the resource's endpoint is `client` now; False when its kubelet is gone."""
        with self._changed:
            if self._gone(generation):
                return False
            self._plugins[client.resource] = client
            self._resources.setdefault(client.resource, ResourceState()).stopped_at = None
            client.watching = self.watch
            self._changed.notify_all()
        return True

    def _run_client(self, client: PluginEndpoint) -> None:
        """Kubelet's runClient: read the stream until it ends, then disconnect the resource's client."""
        self._list_and_watch(client)
        if self.disconnect_delay > 0:
            time.sleep(self.disconnect_delay)
        with self._changed:
            if self._gone(client.generation):
                return  # that kubelet is gone; the next one starts from its checkpoint
            current = self._clients.get(client.resource)  # getClient(name): whoever it is now
        if current is not None:
            self._disconnect(current)

    def _list_and_watch(self, client: PluginEndpoint) -> None:
        try:
            stream = client.stub.ListAndWatch(pb.Empty())
            client.stream = stream
            for response in stream:
                with self._changed:
                    state = self._resources.setdefault(client.resource, ResourceState())
                    state.devices = {d.ID: d for d in response.devices}  # by resource name
                    client.updates += 1
                    client.last_update = time.perf_counter()
                    self._changed.notify_all()
        except (grpc.RpcError, ValueError):
            # The plugin or the stand-in ended it (ValueError: the channel was closed before the stream
            # opened, when the stand-in restarts quickly).
            pass
        finally:
            with self._changed:
                client.watching = False
                if client in self.superseded:
                    self.superseded.remove(client)
                self._changed.notify_all()

    def _disconnect(self, client: PluginEndpoint) -> None:
        """disconnectClient: deregister by name, close the channel, then PluginDisconnected."""
        with self._changed:
            self._clients.pop(client.resource, None)
            dialled = client.dialled
        if dialled:  # a client still dialling has no connection yet: kubelet closes nothing then
            client.channel.close()
        with self._changed:
            state = self._resources.get(client.resource)
            if client.resource in self._plugins and state is not None:
                state.mark_unhealthy()
                state.stopped_at = time.monotonic()
                self.disconnects.append(client.resource)
                log.info("kubelet stand-in: %s disconnected, its devices marked Unhealthy", client.resource)
            self._changed.notify_all()

    def close_stream(self, resource: str) -> None:
        """Kubelet ends the resource's ListAndWatch stream itself (and disconnects it, as it always does)."""
        with self._changed:
            client = self._clients.get(resource)
        if client is not None and client.stream is not None:
            client.stream.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves it unannotated

    def _tick_until(self, stop: threading.Event) -> None:
        while not stop.wait(self.node_status_interval):
            with self._changed:
                for name in node_status_tick(self._resources, time.monotonic(), self.endpoint_stop_grace):
                    self._plugins.pop(name, None)
                self.ticks += 1
                self._changed.notify_all()

    # ---- what a test or the demo asks -------------------------------------------------------

    def plugin(self, resource: str) -> PluginEndpoint:
        with self._changed:
            return self._plugins[resource]

    def resources(self) -> list[str]:
        with self._changed:
            return sorted(self._plugins)

    def devices(self, resource: str) -> dict[str, pb.Device]:
        with self._changed:
            state = self._resources.get(resource)
            return dict(state.devices) if state else {}

    def connected(self, resource: str) -> bool:
        """Whether kubelet has a live client of the resource: registered, dialled, its stream open."""
        with self._changed:
            client = self._clients.get(resource)
            return client is not None and client is self._plugins.get(resource) and client.watching

    def node_status(self, resource: str) -> tuple[int, int]:
        """The resource's (capacity, allocatable) in the node status, as of the last node-status tick."""
        with self._changed:
            state = self._resources.get(resource)
            return (state.capacity, state.allocatable) if state else (0, 0)

    def wait_for_ticks(self, count: int = 1, timeout: float | None = None) -> bool:
        """Wait until `count` more node-status ticks have happened."""
        with self._changed:
            target = self.ticks + count
        return self.wait_for(lambda: self.ticks >= target, timeout)

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Wait until predicate() (evaluated under the stand-in's lock) holds; False on timeout (`wait_s`
        when not given)."""
        return wait_under(self._changed, predicate, self.wait_s if timeout is None else timeout)

    def wait_for_resources(self, names: Sequence[str], timeout: float | None = None) -> bool:
        """Wait until every resource is connected and has sent its device list."""

        def listed(name: str) -> bool:
            client = self._clients.get(name)
            return client is not None and client is self._plugins.get(name) and client.updates > 0

        return self.wait_for(lambda: all(listed(n) for n in names), timeout)

    def allocate(
        self, resource: str, containers: Sequence[Sequence[str]], timeout: float | None = None
    ) -> pb.AllocateResponse:
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in containers]
        )
        deadline = self.call_s if timeout is None else timeout
        response: pb.AllocateResponse = self.plugin(resource).stub.Allocate(request, timeout=deadline)
        return response

    def preferred(
        self,
        resource: str,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        timeout: float | None = None,
    ) -> list[str]:
        request = preferred_request(available, must_include, size)
        deadline = self.call_s if timeout is None else timeout
        response = self.plugin(resource).stub.GetPreferredAllocation(request, timeout=deadline)
        return list(response.container_responses[0].deviceIDs)

    def admit(self, resource: str, count: int) -> tuple[list[str], pb.ContainerAllocateResponse]:
        """Admit a one-container pod asking for `count` devices, as kubelet's device manager would.

        AdmissionError (the pod's rejection, worded as kubelet words it) when it cannot be admitted.
        """
        with self._changed:
            plugin = self._plugins.get(resource)
            state = self._resources.get(resource)
            free = state.healthy_free() if state is not None else []
        if plugin is None or state is None:
            raise unexpected(f"unknown Device Plugin {resource}")
        chosen, response = admit_container(
            resource,
            free,
            count,
            self.topology_policy,
            partial(self.preferred, resource) if plugin.options.get_preferred_allocation_available else None,
            partial(self.allocate, resource),
        )
        with self._changed:
            state.allocated.update(chosen)
        return chosen, response

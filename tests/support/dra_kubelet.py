"""Kubelet's DRA side as a stand-in, and what the DRA kubelet plugin's tests build their nodes from.

`DraKubeletStandIn` does what kubelet's plugin watcher and DRA manager do, over the real sockets: it
watches the plugins_registry directory (a reconcile pass at start, then one on every inotify event and
every 50 ms), asks each new socket GetInfo, takes the first of the plugin's versions it
supports itself, says so through NotifyRegistrationStatus, dials the endpoint, and calls
NodePrepareResources / NodeUnprepareResources there in that version. A deleted socket deregisters the
driver; `restart()` forgets every driver and walks the directory again, as a restarted kubelet does.

Besides: `resource_claim` builds a ResourceClaim as the API returns it; `simulated_node` a NodeDevices of a
simulated preset; `cdi_support` gives tests/cdi's CDI schema check;
`serve_main` runs a plugin in a child process for the restart tests.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from nvidia_device_plugin.api.dra.v1 import api_pb2 as v1_pb
from nvidia_device_plugin.api.dra.v1 import api_pb2_grpc as v1_grpc
from nvidia_device_plugin.api.dra.v1beta1 import api_pb2 as v1beta1_pb
from nvidia_device_plugin.api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from nvidia_device_plugin.api.pluginregistration.v1 import api_pb2 as reg_pb
from nvidia_device_plugin.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from nvidia_device_plugin.base.fswatch import stop_watching, watch_events
from nvidia_device_plugin.base.workers import wait_under
from nvidia_device_plugin.cdi.model import CdiSettings
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.configmanager.nodewatch import api_client_for
from nvidia_device_plugin.dra.kinds.mig import MIG
from nvidia_device_plugin.dra.kubelet.cdispec import claim_spec_file
from nvidia_device_plugin.dra.kubelet.claims import ApiClaimSource
from nvidia_device_plugin.dra.kubelet.model import NodeDevices
from nvidia_device_plugin.dra.kubelet.plugin import DraKubeletPlugin
from nvidia_device_plugin.dra.names import DRIVER_NAME, DraDevice, mig_device_name, whole_gpus
from nvidia_device_plugin.nvml.session import NvmlSession, open_nvml
from nvidia_device_plugin.snapshot import build_snapshot

from support.fake_apiserver import FakeApiServer
from support.waiting import scaled

KUBELET_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # what kubelet 1.34+ supports
NODE = "gpu-node-1"
_STUBS: dict[str, tuple[ModuleType, Any]] = {
    "v1.DRAPlugin": (v1_pb, v1_grpc.DRAPluginStub),
    "v1beta1.DRAPlugin": (v1beta1_pb, v1beta1_grpc.DRAPluginStub),
}
# A socket file: (inode, ctime). A socket made anew may get the inode of the one it replaced, never its
# ctime, so a replaced socket is told from the same one without relying on the order of inotify events.
Identity = tuple[int, int]
_CDI_SUPPORT = Path(__file__).resolve().parent.parent / "cdi" / "cdi_support.py"


@dataclass
class RegisteredDriver:
    """A driver the stand-in registered: what GetInfo said, the version chosen, a client of the endpoint."""

    info: reg_pb.PluginInfo
    socket: Path
    identity: Identity
    version: str
    endpoint_served: bool  # a call on the endpoint answered when the registration socket was found
    channel: grpc.Channel
    messages: ModuleType
    stub: Any


class DraKubeletStandIn:
    """Kubelet's plugin watcher and DRA manager for the sockets in `registry_dir`."""

    def __init__(self, registry_dir: Path, supported: Sequence[str] = KUBELET_VERSIONS) -> None:
        self.registry_dir = registry_dir
        self.supported = tuple(supported)
        self.drivers: dict[str, RegisteredDriver] = {}
        self.registrations: list[RegisteredDriver] = []
        self.refusals: list[str] = []  # the errors sent with NotifyRegistrationStatus(false)
        self.deregistrations: list[str] = []
        self._changed = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._refused: dict[Path, Identity] = {}  # socket refused, not asked again until it is replaced
        # Channels of drivers registered anew or gone: closed at stop, so a call in flight on one ends.
        self._retired: list[grpc.Channel] = []
        self._thread: threading.Thread | None = None
        self._observer: Any = None

    def start(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._stop.clear()
        wake = self._wake.set  # any change to an entry wakes the reconcile pass at once
        self._observer = watch_events([self.registry_dir], lambda _event: wake(), "dra-standin-watch")
        self._thread = threading.Thread(target=self._reconcile_loop, name="dra-standin", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(scaled(10))
        if self._observer is not None:
            stop_watching(self._observer)
        with self._changed:
            channels = [d.channel for d in self.drivers.values()] + self._retired
            self.drivers.clear()
            self._retired = []
            self._refused.clear()
        for channel in channels:
            channel.close()

    def restart(self) -> None:  # as kubelet restarts: every driver forgotten, the directory walked again
        self.stop()
        self.start()

    def __enter__(self) -> DraKubeletStandIn:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- the plugin watcher ---------------------------------------------------------------------

    def _reconcile_loop(self) -> None:
        while not self._stop.is_set():
            self._reconcile()
            self._wake.wait(0.05)
            self._wake.clear()

    def _reconcile(self) -> None:
        sockets = {p: ident for p in self.registry_dir.glob("*.sock") if (ident := _identity(p))}
        with self._changed:
            known = {d.socket: (name, d.identity) for name, d in self.drivers.items()}
        for path, (name, identity) in known.items():
            if sockets.get(path) != identity:
                self._deregister(name)
        for path, identity in sockets.items():
            if known.get(path, ("", None))[1] != identity and self._refused.get(path) != identity:
                self._register(path, identity)

    def _register(self, path: Path, identity: Identity) -> None:
        try:
            with grpc.insecure_channel(f"unix:{path}") as channel:
                registration = reg_grpc.RegistrationStub(channel)
                info = registration.GetInfo(reg_pb.InfoRequest(), timeout=scaled(5))
                error = self._refusal(info)
                registration.NotifyRegistrationStatus(
                    reg_pb.RegistrationStatus(plugin_registered=error is None, error=error or ""),
                    timeout=scaled(5),
                )
        except grpc.RpcError:
            return  # not serving (yet): asked again at the next pass, as kubelet retries
        if error is not None:
            with self._changed:
                self._refused[path] = identity
                self.refusals.append(error)
                self._changed.notify_all()
            return
        version = next(v for v in info.supported_versions if v in self.supported)
        messages, stub_type = _STUBS[version]
        channel = grpc.insecure_channel(f"unix:{info.endpoint or path}")
        stub = stub_type(channel)
        try:
            stub.NodePrepareResources(messages.NodePrepareResourcesRequest(), timeout=scaled(5))
            served = True
        except grpc.RpcError:
            served = False
        driver = RegisteredDriver(info, path, identity, version, served, channel, messages, stub)
        with self._changed:
            if (old := self.drivers.get(info.name)) is not None:
                self._retired.append(old.channel)
            self.drivers[info.name] = driver
            self.registrations.append(driver)
            self._changed.notify_all()

    def _refusal(self, info: reg_pb.PluginInfo) -> str | None:
        if info.type != "DRAPlugin":
            return f"plugin type {info.type!r} is not handled here"
        if not any(v in self.supported for v in info.supported_versions):
            return (
                f"none of the versions {list(info.supported_versions)} is supported ({list(self.supported)})"
            )
        return None

    def _deregister(self, name: str) -> None:
        with self._changed:
            if (driver := self.drivers.pop(name, None)) is not None:
                self._retired.append(driver.channel)
            self.deregistrations.append(name)
            self._changed.notify_all()

    # ---- what a test asks -----------------------------------------------------------------------

    def wait_for(self, predicate: Callable[[], bool], timeout: float = scaled(10.0)) -> bool:
        """Wait until predicate() holds (evaluated under the stand-in's lock); False after `timeout`."""
        return wait_under(self._changed, predicate, timeout)

    def driver(self, name: str = DRIVER_NAME, timeout: float = scaled(10.0)) -> RegisteredDriver:
        """The registered driver `name`, waiting for its registration."""
        assert self.wait_for(lambda: name in self.drivers, timeout), f"{name} never registered"
        with self._changed:
            return self.drivers[name]

    def current(
        self, socket: Path, name: str = DRIVER_NAME, timeout: float = scaled(10.0)
    ) -> RegisteredDriver:
        """Driver `name` once it is registered through the socket file now at `socket` (not an older one)."""

        def registered_now() -> bool:
            driver = self.drivers.get(name)
            return driver is not None and driver.identity == _identity(socket)

        assert self.wait_for(registered_now, timeout), f"{name} was not registered through {socket}"
        with self._changed:
            return self.drivers[name]

    def prepare(self, claims: Sequence[tuple[str, str, str]], name: str = DRIVER_NAME) -> Any:
        """NodePrepareResources for (namespace, name, uid) claims: the response's claims map."""
        driver = self.driver(name)
        refs = [driver.messages.Claim(namespace=ns, name=n, uid=uid) for ns, n, uid in claims]
        request = driver.messages.NodePrepareResourcesRequest(claims=refs)
        return driver.stub.NodePrepareResources(request, timeout=scaled(30)).claims

    def unprepare(self, claims: Sequence[tuple[str, str, str]], name: str = DRIVER_NAME) -> Any:
        driver = self.driver(name)
        refs = [driver.messages.Claim(namespace=ns, name=n, uid=uid) for ns, n, uid in claims]
        request = driver.messages.NodeUnprepareResourcesRequest(claims=refs)
        return driver.stub.NodeUnprepareResources(request, timeout=scaled(30)).claims


def _identity(path: Path) -> Identity | None:
    try:
        info = path.lstat()
    except OSError:
        return None  # gone meanwhile
    return (info.st_ino, info.st_ctime_ns) if stat.S_ISSOCK(info.st_mode) else None


def resource_claim(
    uid: str,
    name: str = "gpu-claim",
    namespace: str = "default",
    results: Sequence[tuple[str, str]] = (("gpu", "gpu-0"),),
    driver: str = DRIVER_NAME,
    allocated: bool = True,
    config: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """A ResourceClaim as the API returns it; `results`: (request, device) of `driver`, pool NODE."""
    claim: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "7"},
        "spec": {"devices": {"requests": [{"name": r.split("/")[0]} for r, _ in results]}},
        "status": {},
    }
    if allocated:
        devices = [{"request": r, "driver": driver, "pool": NODE, "device": d} for r, d in results]
        claim["status"]["allocation"] = {"devices": {"results": devices, "config": list(config)}}
    return claim


def simulated_node(preset: str, config: Config | None = None) -> tuple[NvmlSession, NodeDevices]:
    """A simulated node's session (close it) and its NodeDevices: whole GPUs, and MIG devices named by
    their GPU-instance ID as placement start (a stand-in for the slices' real placements)."""
    session = open_nvml(preset)
    snapshot = build_snapshot(session, config or Config())
    devices = dict(whole_gpus(snapshot.inventory))
    for gpu in snapshot.inventory.gpus:
        for mig in gpu.mig_devices:
            name = mig_device_name(gpu, mig.profile, mig.profile_id or 0, mig.gpu_instance_id)
            devices[name] = DraDevice(name, gpu, mig, MIG)
    cdi = CdiSettings.from_config(snapshot.config)
    return session, NodeDevices(devices, snapshot.inventory, session.host, cdi)


def cdi_support() -> ModuleType:
    """tests/cdi's shared helpers (assert_valid_spec, cdi_config, gpu_spec), from the file itself."""
    name = "_cdi_support_for_dra"
    if (module := sys.modules.get(name)) is None:
        spec = importlib.util.spec_from_file_location(name, _CDI_SUPPORT)
        assert spec is not None and spec.loader is not None
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


class DraNode:
    """One test's node: its directories (under a short /tmp path: a unix socket path holds at most 107
    bytes), the stand-in API server, the devices; `plugin()` makes a DraKubeletPlugin on them."""

    def __init__(self, root: Path, api: FakeApiServer, node: NodeDevices) -> None:
        self.root, self.api, self.node = root, api, node
        self.plugins_dir = root / "plugins"
        self.registry_dir = root / "plugins_registry"
        self.spec_dir = root / "cdi"
        self.checkpoint = self.plugins_dir / DRIVER_NAME / "checkpoint.json"
        self.boot_id = root / "boot_id"
        self.started: list[DraKubeletPlugin] = []

    def plugin(self, start: bool = True, **more: Any) -> DraKubeletPlugin:
        """A plugin on this node (`more` overrides constructor arguments), started unless told not to."""
        if not self.boot_id.exists():
            self.boot_id.write_text("6f1e1c3a-0000-4000-8000-000000000001\n")
        options: dict[str, Any] = {
            "plugins_dir": self.plugins_dir,
            "registry_dir": self.registry_dir,
            "claims": ApiClaimSource(api_client_for(self.api.url)),
            "node": lambda: self.node,
            "cdi_spec_dir": self.spec_dir,
            "checkpoint_path": self.checkpoint,
            "boot_id_path": self.boot_id,
            "check_interval_s": 0.05,
            **more,
        }
        plugin = DraKubeletPlugin(**options)
        self.started.append(plugin)
        if start:
            plugin.start()
        return plugin

    def spec(self, uid: str) -> dict[str, Any]:
        """Claim `uid`'s CDI spec as written, checked against the CDI schema."""
        document: dict[str, Any] = json.loads((self.spec_dir / claim_spec_file(uid)).read_text())
        cdi_support().assert_valid_spec(document)
        return document


def dra_node(preset: str = "dgx-a100") -> Iterator[DraNode]:
    """For a fixture: `yield from dra_node()`; everything is stopped and removed afterwards. The simulated
    node is made once per preset and process (its host tree is only read: specs go to the test's own
    directory) and closed at exit."""
    if preset not in _NODES:
        _NODES[preset] = simulated_node(preset)
        atexit.register(_NODES[preset][0].close)
    root = Path(tempfile.mkdtemp(prefix=f"dra-{os.getpid()}-", dir="/tmp"))
    try:
        with FakeApiServer({}) as api:
            setup = DraNode(root, api, _NODES[preset][1])
            try:
                yield setup
            finally:
                for plugin in setup.started:
                    plugin.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


_NODES: dict[str, tuple[NvmlSession, NodeDevices]] = {}


# ---- a plugin in a process of its own -------------------------------------------------------------


def serve_main(argv: Sequence[str]) -> None:
    """`python -c ... serve_main(sys.argv[1:])`: a DraKubeletPlugin until SIGTERM (or SIGKILL).

    Argument: a JSON object with `paths` (the constructor's path arguments by name), `api_url` and
    `preset`. Prints "serving" once started.
    """
    args = json.loads(argv[0])
    session, node = simulated_node(args["preset"])
    plugin = DraKubeletPlugin(
        **{name: Path(path) for name, path in args["paths"].items()},
        claims=ApiClaimSource(api_client_for(args["api_url"])),
        node=lambda: node,
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    plugin.start()
    print("serving", flush=True)
    done.wait()
    plugin.stop()
    session.close()

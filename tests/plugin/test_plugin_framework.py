"""The generic device-plugin framework against the kubelet stand-in, over real unix sockets."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.base.errors import AllocationError
from nvidia_device_plugin.plugin.manager import PluginManager, ResourceSpec
from nvidia_device_plugin.plugin.server import DeviceState
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.kubelet_standin import kubelet_standin
from support.threads import DIRECTORY_WATCH, counted_threads, threads_named
from support.waiting import eventually, scaled


class FakeBackend:
    def __init__(self, ids: Sequence[str], numa: int | None = 0) -> None:
        self.states = [DeviceState(i, True, numa) for i in ids]

    def devices(self) -> Sequence[DeviceState]:
        return list(self.states)

    def allocate(self, requests: Sequence[Sequence[str]]) -> pb.AllocateResponse:
        known = {s.id for s in self.states}
        response = pb.AllocateResponse()
        for ids in requests:
            for i in ids:
                if i not in known:
                    raise AllocationError(f"unknown device ID {i!r}")
            response.container_responses.add(envs={"DEVICES": ",".join(ids)})
        return response

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        rest = [a for a in sorted(available) if a not in must_include]
        return list(must_include) + rest[: size - len(must_include)]


def serve(manager: PluginManager, backends: dict[str, FakeBackend]) -> None:
    manager.apply(
        {
            name: ResourceSpec(name, f"fake-{i}.sock", b)
            for i, (name, b) in enumerate(sorted(backends.items()))
        }
    )


def test_registers_each_resource_with_its_own_socket(kubelet: KubeletStandIn, manager: PluginManager) -> None:
    serve(manager, {"example.com/a": FakeBackend(["a0", "a1"]), "example.com/b": FakeBackend(["b0"])})
    assert kubelet.wait_for_resources(["example.com/a", "example.com/b"])
    by_resource = {r.resource_name: r for r in kubelet.registrations}
    assert by_resource["example.com/a"].version == "v1beta1"
    assert by_resource["example.com/a"].endpoint == "fake-0.sock"
    assert by_resource["example.com/b"].endpoint == "fake-1.sock"
    assert by_resource["example.com/a"].options.get_preferred_allocation_available
    assert manager.all_registered() or kubelet.wait_for(manager.all_registered)


def test_list_and_watch_sends_devices_with_numa_and_pushes_changes(
    kubelet: KubeletStandIn, manager: PluginManager
) -> None:
    backend = FakeBackend(["d0", "d1"], numa=1)
    serve(manager, {"example.com/d": backend})
    assert kubelet.wait_for_resources(["example.com/d"])
    devices = kubelet.devices("example.com/d")
    assert sorted(devices) == ["d0", "d1"]
    assert devices["d0"].health == "Healthy"
    assert [n.ID for n in devices["d0"].topology.nodes] == [1]

    backend.states[1] = DeviceState("d1", False, 1)
    manager.notify("example.com/d")
    assert kubelet.wait_for(lambda: kubelet.devices("example.com/d")["d1"].health == "Unhealthy")


def test_device_without_numa_has_no_topology(kubelet: KubeletStandIn, manager: PluginManager) -> None:
    serve(manager, {"example.com/n": FakeBackend(["x"], numa=None)})
    assert kubelet.wait_for_resources(["example.com/n"])
    assert not kubelet.devices("example.com/n")["x"].HasField("topology")


def test_allocate_errors_are_invalid_argument_and_server_keeps_serving(
    kubelet: KubeletStandIn, manager: PluginManager
) -> None:
    serve(manager, {"example.com/d": FakeBackend(["d0"])})
    assert kubelet.wait_for_resources(["example.com/d"])
    with pytest.raises(grpc.RpcError) as err:
        kubelet.allocate("example.com/d", [["nope"]])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "nope" in err.value.details()
    response = kubelet.allocate("example.com/d", [["d0"]])
    assert response.container_responses[0].envs["DEVICES"] == "d0"


def test_rejected_registration_is_retried_and_logged_once(
    plugin_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    attempts: list[str] = []

    def reject(request: pb.RegisterRequest) -> str | None:
        attempts.append(request.resource_name)
        return "resource name already taken" if len(attempts) < 4 else None

    with kubelet_standin(plugin_dir, reject=reject) as kubelet:
        manager = PluginManager(plugin_dir)
        manager.start()
        try:
            serve(manager, {"example.com/r": FakeBackend(["r0"])})
            assert kubelet.wait_for_resources(["example.com/r"])
            assert manager.all_registered() or kubelet.wait_for(manager.all_registered)
        finally:
            manager.stop()
    failures = [
        r for r in caplog.records if "registering example.com/r with kubelet failed" in r.getMessage()
    ]
    assert len(attempts) >= 4
    assert len(failures) == 1
    assert "resource name already taken" in failures[0].getMessage()


def test_starts_before_kubelet_and_registers_when_it_appears(plugin_dir: Path) -> None:
    manager = PluginManager(plugin_dir)
    manager.start()
    try:
        serve(manager, {"example.com/late": FakeBackend(["l0"])})
        assert not manager.all_registered()
        with kubelet_standin(plugin_dir) as kubelet:
            assert kubelet.wait_for_resources(["example.com/late"])
    finally:
        manager.stop()


def test_after_first_registrations_waits_for_kubelet_and_is_called_once(plugin_dir: Path) -> None:
    """`run` makes its config file's event watch from this hook: not while kubelet is away (the registrar's
    rounds register nothing), once every served resource is registered, and never again (not after a kubelet
    restart)."""
    calls: list[tuple[str, bool]] = []
    manager = PluginManager(
        plugin_dir,
        after_first_registrations=lambda: calls.append(
            (threading.current_thread().name, manager.all_registered())
        ),
    )
    manager.start()
    try:
        serve(manager, {"example.com/a": FakeBackend(["a0"]), "example.com/b": FakeBackend(["b0"])})
        # The registrar's first round ends by watching the directory; after it, rounds without kubelet.
        assert eventually(lambda: threads_named(DIRECTORY_WATCH) != [])
        threading.Event().wait(scaled(0.3))
        assert calls == []
        with kubelet_standin(plugin_dir) as kubelet:
            assert kubelet.wait_for_resources(["example.com/a", "example.com/b"])
            assert kubelet.wait_for(lambda: len(calls) == 1)
            kubelet.restart()
            assert kubelet.wait_for_resources(["example.com/a", "example.com/b"])
            assert kubelet.wait_for(manager.all_registered)
    finally:
        manager.stop()
    assert calls == [("plugin-registrar", True)]


def test_a_kubelet_restart_before_the_directory_watch_is_in_place_is_seen_at_once(
    plugin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registrar makes the directory watch after its first registrations (kubelet need not wait for
    it). A kubelet restart in between makes no event, and this kubelet opens no ListAndWatch stream whose
    end would tell; the restart is seen once the watch is in place, not at the registrar's next look, here
    an hour away."""
    from nvidia_device_plugin.base import fswatch

    made = fswatch.watch_entries
    restarted = threading.Event()
    with kubelet_standin(plugin_dir, watch=False) as kubelet:

        def restart_first(*args: Any, **kwargs: Any) -> Any:
            if not restarted.is_set():
                kubelet.restart()  # in the window: registered, not yet watched
                restarted.set()
            return made(*args, **kwargs)

        monkeypatch.setattr(fswatch, "watch_entries", restart_first)
        manager = PluginManager(plugin_dir, max_retry_seconds=3600)
        manager.start()
        try:
            serve(manager, {"example.com/a": FakeBackend(["a0"])})
            assert kubelet.wait_for(restarted.is_set)
            assert kubelet.wait_for(lambda: kubelet.resources() == ["example.com/a"])  # the new kubelet's
        finally:
            manager.stop()


def test_kubelet_restarts_twenty_times_without_leaks(kubelet: KubeletStandIn, manager: PluginManager) -> None:
    serve(manager, {"example.com/a": FakeBackend(["a0"]), "example.com/b": FakeBackend(["b0"])})
    assert kubelet.wait_for_resources(["example.com/a", "example.com/b"])
    kubelet.restart()
    assert kubelet.wait_for_resources(["example.com/a", "example.com/b"])
    threads_before = counted_threads()
    fds_before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        kubelet.restart()
        assert kubelet.wait_for_resources(["example.com/a", "example.com/b"], timeout=scaled(5))
        assert kubelet.allocate("example.com/a", [["a0"]]).container_responses[0].envs["DEVICES"] == "a0"
    assert kubelet.wait_for(manager.all_registered)
    # Allow the short-lived stream threads of the last restart to wind down; growth would be per restart.
    assert kubelet.wait_for(lambda: counted_threads() <= threads_before + 2, timeout=scaled(5)), (
        f"threads grew from {threads_before} to {counted_threads()} over 20 restarts"
    )
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 8


def test_vanished_resource_stops_and_removes_its_socket(
    kubelet: KubeletStandIn, manager: PluginManager, plugin_dir: Path
) -> None:
    serve(manager, {"example.com/a": FakeBackend(["a0"]), "example.com/b": FakeBackend(["b0"])})
    assert kubelet.wait_for_resources(["example.com/a", "example.com/b"])
    manager.apply({"example.com/a": ResourceSpec("example.com/a", "fake-0.sock", FakeBackend(["a0", "a1"]))})
    assert not (plugin_dir / "fake-1.sock").exists()
    assert manager.served() == {"example.com/a"}
    assert kubelet.wait_for(lambda: sorted(kubelet.devices("example.com/a")) == ["a0", "a1"])


def test_stop_removes_sockets_and_threads(plugin_dir: Path, kubelet: KubeletStandIn) -> None:
    baseline = {t.name for t in threading.enumerate()}
    manager = PluginManager(plugin_dir)
    manager.start()
    serve(manager, {"example.com/a": FakeBackend(["a0"])})
    assert kubelet.wait_for_resources(["example.com/a"])
    manager.stop()
    assert not (plugin_dir / "fake-0.sock").exists()

    def ours_left() -> set[str]:
        # The stand-in's own threads (kubelet-*) are not the plugin's to clean up.
        return {t.name for t in threading.enumerate() if not t.name.startswith("kubelet-")} - baseline

    assert kubelet.wait_for(lambda: not ours_left(), timeout=scaled(5)), ours_left()

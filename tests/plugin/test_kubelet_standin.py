"""The kubelet stand-in behaves as kubelet's (v1.36) device manager does where a plugin can tell.

Each test drives the stand-in with a bare plugin: one ResourceServer on its socket and the Register call,
no PluginManager, so nothing here re-registers behind the stand-in's back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from test_plugin_framework import FakeBackend

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.plugin.registration import RegistrationError, register
from nvidia_device_plugin.plugin.server import DeviceState, ResourceServer
from nvidia_device_plugin.standins.kubelet import KubeletStandIn
from nvidia_device_plugin.standins.kubelet_devices import AdmissionError

from support.kubelet_standin import kubelet_standin
from support.waiting import scaled

RESOURCE = "example.com/dev"


class NumaBackend(FakeBackend):
    """Devices d0-d3 on NUMA node 0 and d4-d7 on node 1; counts GetPreferredAllocation calls."""

    def __init__(self) -> None:
        super().__init__([])
        self.states = [DeviceState(f"d{n}", True, n // 4) for n in range(8)]
        self.offered: list[list[str]] = []

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        self.offered.append(sorted(available))
        return sorted(available)[-size:]  # the highest IDs: tells its answer apart from kubelet's own pick


def bare_server(plugin_dir: Path, backend: FakeBackend, socket: str = "dev.sock") -> ResourceServer:
    server = ResourceServer(RESOURCE, plugin_dir / socket, backend)
    server.start()
    return server


def register_once(kubelet: KubeletStandIn, endpoint: str = "dev.sock") -> None:
    register(kubelet.socket, RESOURCE, endpoint, threading.Event())


@pytest.fixture
def served(plugin_dir: Path, kubelet: KubeletStandIn) -> Iterator[ResourceServer]:
    server = bare_server(plugin_dir, FakeBackend([f"d{n}" for n in range(4)]))
    register_once(kubelet)
    assert kubelet.wait_for_resources([RESOURCE])
    yield server
    server.stop()


def test_a_stream_end_marks_every_device_unhealthy_and_kubelet_never_dials_again(
    kubelet: KubeletStandIn, served: ResourceServer
) -> None:
    served.stop()
    assert kubelet.wait_for(lambda: kubelet.disconnects == [RESOURCE])
    assert {d.health for d in kubelet.devices(RESOURCE).values()} == {"Unhealthy"}
    assert len(kubelet.devices(RESOURCE)) == 4
    served.start()  # the plugin serves again on the same socket, but does not register
    assert not kubelet.wait_for(lambda: kubelet.connected(RESOURCE), timeout=0.5)
    assert len(kubelet.registrations) == 1
    register_once(kubelet)  # only a new Register brings the resource back
    assert kubelet.wait_for_resources([RESOURCE])
    assert {d.health for d in kubelet.devices(RESOURCE).values()} == {"Healthy"}


def test_closing_the_stream_itself_disconnects_the_resource(
    kubelet: KubeletStandIn, served: ResourceServer
) -> None:
    kubelet.close_stream(RESOURCE)
    assert kubelet.wait_for(lambda: kubelet.disconnects == [RESOURCE])
    assert not kubelet.connected(RESOURCE)
    assert {d.health for d in kubelet.devices(RESOURCE).values()} == {"Unhealthy"}


def test_a_stream_ending_after_a_new_registration_disconnects_the_new_client(
    plugin_dir: Path, served: ResourceServer
) -> None:
    # kubelet's runClient looks the client up by resource name once the old stream has ended. The delay
    # holds the stop and the second Register: 0.3 s was too short for them on a busy machine.
    with kubelet_standin(plugin_dir, disconnect_delay=2.0) as kubelet:
        register_once(kubelet)
        assert kubelet.wait_for_resources([RESOURCE])
        second = bare_server(plugin_dir, FakeBackend(["d0"]), "second.sock")
        try:
            served.stop()  # the first registration's stream ends ...
            register_once(kubelet, "second.sock")  # ... and the plugin is back before kubelet looked
            assert kubelet.wait_for(lambda: kubelet.disconnects == [RESOURCE])
            assert not kubelet.connected(RESOURCE)
            assert kubelet.devices(RESOURCE)["d0"].health == "Unhealthy"
        finally:
            second.stop()


def test_a_register_naming_an_endpoint_kubelet_cannot_dial_drops_the_live_registration(
    kubelet: KubeletStandIn, served: ResourceServer
) -> None:
    with pytest.raises(RegistrationError, match="cannot dial back"):
        register_once(kubelet, "nothing-here.sock")
    assert kubelet.dial_failures == ["nothing-here.sock"]
    assert not kubelet.connected(RESOURCE)
    # The devices stay "Healthy", and when the plugin behind them goes, nobody notices.
    served.stop()
    assert not kubelet.wait_for(lambda: bool(kubelet.disconnects), timeout=0.5)
    assert {d.health for d in kubelet.devices(RESOURCE).values()} == {"Healthy"}


def test_a_killed_kubelet_leaves_a_dead_socket_and_its_start_wipes_every_socket(
    plugin_dir: Path, kubelet: KubeletStandIn, served: ResourceServer
) -> None:
    (plugin_dir / "notes.txt").write_text("not a socket\n")
    kubelet.kill()
    assert kubelet.socket.is_socket()
    with pytest.raises(RegistrationError, match="UNAVAILABLE"):
        register_once(kubelet)
    assert served.socket_path.is_socket()  # a killed kubelet deletes nothing
    kubelet.start()
    assert not served.socket_path.exists()
    assert (plugin_dir / "notes.txt").exists()
    assert kubelet.socket.is_socket()
    assert kubelet.devices(RESOURCE) == {}  # from the checkpoint: known, no devices until re-registered


def test_a_register_still_handled_when_kubelet_dies_changes_nothing_of_the_next_kubelet(
    kubelet: KubeletStandIn, served: ResourceServer
) -> None:
    held, release = threading.Event(), threading.Event()

    def hold_first(request: pb.RegisterRequest) -> None:
        if not held.is_set():
            held.set()
            release.wait(scaled(10))

    kubelet.reject = hold_first
    failed: list[RegistrationError] = []

    def register_in_flight() -> None:
        try:
            register_once(kubelet)
        except RegistrationError as exc:
            failed.append(exc)

    caller = threading.Thread(target=register_in_flight, daemon=True)
    caller.start()
    assert held.wait(scaled(10))  # inside the old kubelet's Register, before its dial-back
    kubelet.restart()
    served.stop()
    served.start()  # the plugin serves anew and registers with the new kubelet
    register_once(kubelet)
    assert kubelet.wait_for_resources([RESOURCE])
    current = kubelet.plugin(RESOURCE)
    release.set()
    caller.join(scaled(10))
    assert not caller.is_alive()
    assert len(failed) == 1  # the dead kubelet never answered it
    assert kubelet.plugin(RESOURCE) is current
    assert kubelet.connected(RESOURCE)
    assert not kubelet.wait_for(lambda: bool(kubelet.disconnects), timeout=0.5)
    assert len(kubelet.registrations) == 3


def test_capacity_follows_node_status_ticks_and_an_expired_resource_goes_at_one(
    plugin_dir: Path,
) -> None:
    # The grace holds the server's stop and the look at the capacity after it: 0.3 s was too short for them
    # on a busy machine.
    with kubelet_standin(plugin_dir, node_status_interval=0.05, endpoint_stop_grace=2.0) as kubelet:
        server = bare_server(plugin_dir, FakeBackend([f"d{n}" for n in range(4)]))
        register_once(kubelet)
        assert kubelet.wait_for_resources([RESOURCE])
        assert kubelet.wait_for_ticks(2)
        assert kubelet.node_status(RESOURCE) == (4, 4)
        server.stop()
        assert kubelet.wait_for(lambda: kubelet.node_status(RESOURCE)[1] == 0)
        assert kubelet.node_status(RESOURCE)[0] == 4  # all Unhealthy, until the grace period ends
        assert kubelet.wait_for(lambda: RESOURCE not in kubelet.resources(), timeout=scaled(5))
        assert kubelet.devices(RESOURCE) == {}


def test_without_a_tick_the_node_status_does_not_move(plugin_dir: Path) -> None:
    with kubelet_standin(plugin_dir, node_status_interval=3600) as kubelet:
        server = bare_server(plugin_dir, FakeBackend(["d0"]))
        try:
            register_once(kubelet)
            assert kubelet.wait_for_resources([RESOURCE])
            assert kubelet.node_status(RESOURCE) == (0, 0)
        finally:
            server.stop()


def test_single_numa_node_offers_only_aligned_devices_and_takes_an_exact_fit_without_asking(
    plugin_dir: Path,
) -> None:
    backend = NumaBackend()
    with kubelet_standin(plugin_dir, topology_policy="single-numa-node") as kubelet:
        server = bare_server(plugin_dir, backend)
        try:
            register_once(kubelet)
            assert kubelet.wait_for_resources([RESOURCE])
            with pytest.raises(AdmissionError, match=r"^TopologyAffinityError: "):
                kubelet.admit(RESOURCE, 5)  # 8 free, but no NUMA node has 5
            chosen, _ = kubelet.admit(RESOURCE, 2)
            assert backend.offered == [["d0", "d1", "d2", "d3"]]  # node 0 only
            assert chosen == ["d2", "d3"]
            chosen, _ = kubelet.admit(RESOURCE, 2)  # exactly d0, d1 are left on node 0
            assert chosen == ["d0", "d1"]
            assert len(backend.offered) == 1
        finally:
            server.stop()


def test_without_a_topology_policy_every_free_device_is_offered(
    kubelet: KubeletStandIn, plugin_dir: Path
) -> None:
    backend = NumaBackend()
    server = bare_server(plugin_dir, backend)
    try:
        register_once(kubelet)
        assert kubelet.wait_for_resources([RESOURCE])
        chosen, _ = kubelet.admit(RESOURCE, 8)  # all of them: still asked
        assert backend.offered == [[f"d{n}" for n in range(8)]]
        assert chosen == [f"d{n}" for n in range(8)]
    finally:
        server.stop()


def test_admission_failures_read_as_kubelet_words_them(
    kubelet: KubeletStandIn, served: ResourceServer
) -> None:
    with pytest.raises(AdmissionError) as err:
        kubelet.admit(RESOURCE, 9)
    assert str(err.value) == (
        "UnexpectedAdmissionError: Allocate failed due to requested number of devices unavailable for "
        f"{RESOURCE}. Requested: 9, Available: 4, which is unexpected"
    )
    served.backend = FakeBackend(["x0", "x1", "x2", "x3"])  # Allocate now refuses the IDs kubelet holds
    with pytest.raises(AdmissionError) as err:
        kubelet.admit(RESOURCE, 1)
    assert str(err.value).startswith(
        "UnexpectedAdmissionError: Allocate failed due to rpc error: code = InvalidArgument desc = "
    )
    assert str(err.value).endswith(", which is unexpected")
    kubelet.close_stream(RESOURCE)
    assert kubelet.wait_for(lambda: kubelet.disconnects == [RESOURCE])
    with pytest.raises(AdmissionError, match="requested number of devices unavailable"):
        kubelet.admit(RESOURCE, 1)  # every device is Unhealthy now


def test_a_wait_that_names_no_timeout_takes_the_stand_ins_budget(plugin_dir: Path) -> None:
    """The suite hands the stand-in budgets scaled to the machine (support.kubelet_standin); every wait and
    call that names none takes them."""
    kubelet = KubeletStandIn(plugin_dir, wait_s=0.01, call_s=0.02)
    assert (kubelet.wait_s, kubelet.call_s) == (0.01, 0.02)
    assert not kubelet.wait_for(lambda: False)  # ends after wait_s, not the 10 s default
    assert not kubelet.wait_for_resources([RESOURCE])
    scaled_kubelet = kubelet_standin(plugin_dir)
    assert (scaled_kubelet.wait_s, scaled_kubelet.call_s) == (scaled(10.0), scaled(5.0))

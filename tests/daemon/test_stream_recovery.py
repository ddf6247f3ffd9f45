"""The daemon keeps kubelet connected to every resource it serves (issue 23, items 1-3).

Reloads that remove and re-add MIG resources meet kubelet's disconnect race: the old stream's end makes
kubelet disconnect whichever client is current, which is already the new one. The kubelet stand-in does
what kubelet does (devices Unhealthy, never dialled again); the daemon must register again. And /healthz
says so when a registered resource goes without a kubelet stream past the grace period.
In-process daemon on simulated nodes, the stand-in over real unix sockets, /healthz over real HTTP.
"""

from __future__ import annotations

import http.client
from pathlib import Path

import pytest

from nvidia_device_plugin.config.v1 import Config, Flags
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU, start_daemon
from support.kubelet_standin import kubelet_standin
from support.markers import soak
from support.waiting import eventually, scaled

MIG = ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"]
MIXED = Config(flags=Flags(mig_strategy="mixed"))
NONE = Config(flags=Flags(mig_strategy="none"))


def status(kubelet: KubeletStandIn, names: list[str]) -> dict[str, str]:
    """Per resource: connected and all Healthy ("ok"), or what is wrong, for the failure message."""
    found = {}
    for name in names:
        health = {d.health for d in kubelet.devices(name).values()}
        if not kubelet.connected(name):
            found[name] = f"disconnected ({sorted(health)})"
        elif health != {"Healthy"}:
            found[name] = f"connected, devices {sorted(health)}"
        else:
            found[name] = "ok"
    return found


def all_served(kubelet: KubeletStandIn, names: list[str]) -> bool:
    return set(status(kubelet, names).values()) == {"ok"}


@pytest.mark.parametrize("cycles", [8, soak(300)])
def test_reloads_removing_and_re_adding_mig_resources_leave_none_disconnected(
    plugin_dir: Path, cycles: int
) -> None:
    configs = [MIXED]
    names = [GPU, *MIG]
    # A kubelet goroutine that takes 200 ms to look at a stream that ended: the disconnect race's window,
    # which a re-registration lands in.
    with kubelet_standin(plugin_dir, disconnect_delay=0.2) as kubelet:
        daemon = start_daemon(plugin_dir, "a100-mig-mixed", lambda: configs[-1])
        try:
            assert kubelet.wait_for_resources(names)
            for n in range(cycles):
                configs.append(NONE)
                assert daemon.reload(f"MIG resources removed ({n})")
                configs.append(MIXED)
                assert daemon.reload(f"MIG resources back ({n})")
                assert kubelet.wait_for(lambda: all_served(kubelet, names), timeout=scaled(10)), (
                    f"after reload cycle {n + 1}: {status(kubelet, names)}"
                )
            for name in MIG:
                device = sorted(kubelet.devices(name))[0]
                kubelet.allocate(name, [[device]])
        finally:
            daemon.stop()


def healthz(port: int) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=scaled(10))
    try:
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def test_healthz_fails_while_a_registered_resource_has_no_kubelet_stream(plugin_dir: Path) -> None:
    # Kubelet accepts Register, but its client never opens the stream: nothing reaches kubelet.
    with kubelet_standin(plugin_dir, watch=False) as kubelet:
        daemon = start_daemon(plugin_dir, metrics_address="127.0.0.1:0", kubelet_stream_grace_s=0.2)
        try:
            assert kubelet.wait_for(daemon.manager.all_registered)
            assert daemon.probes is not None
            port = daemon.probes.port
            assert eventually(lambda: healthz(port)[0] == 503), healthz(port)
            assert f"{GPU} has had no ListAndWatch stream from kubelet" in healthz(port)[1]
        finally:
            daemon.stop()

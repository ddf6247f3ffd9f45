"""Scrapers, however many, cannot starve the kubelet-facing path: Allocate answers during a scrape flood, and
the flood leaves no threads or descriptors behind. The soak-sized variant runs under `make soak`."""

from __future__ import annotations

import http.client
import os
import threading
from pathlib import Path

import pytest

from nvidia_device_plugin.config.v1 import Config, ReplicatedResource, ReplicatedResources, Sharing
from nvidia_device_plugin.standins.kubelet import KubeletStandIn
from nvidia_device_plugin.telemetry.probes import MAX_SCRAPES

from support.daemon_support import GPU, gpu_uuids, start_daemon
from support.markers import soak
from support.threads import DIRECTORY_WATCH, counted_threads, threads_named
from support.waiting import scaled

SCRAPERS = 2 * MAX_SCRAPES  # more than the server serves at once: some are refused (503), none may hang


def _scrape(port: int) -> int:
    """One scrape; the status (503 past the scrape bound), or 0 when the server closed it unanswered."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=scaled(10))
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        response.read()
        return response.status
    except (ConnectionError, http.client.RemoteDisconnected):
        return 0
    finally:
        connection.close()


def _scrape_into(port: int, statuses: list[int]) -> None:
    statuses.append(_scrape(port))


@pytest.mark.parametrize("rounds", [3, soak(300)])
def test_allocate_answers_through_a_scrape_flood_without_leaks(
    plugin_dir: Path, kubelet: KubeletStandIn, rounds: int
) -> None:
    shared = Sharing(time_slicing=ReplicatedResources(resources=(ReplicatedResource(name=GPU, replicas=64),)))
    daemon = start_daemon(
        plugin_dir, load_config=lambda: Config(sharing=shared), metrics_address="127.0.0.1:0"
    )
    try:
        assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8 * 64)
        assert daemon.probes is not None
        port = daemon.probes.port
        assert _scrape(port) == 200
        assert kubelet.wait_for(lambda: threads_named(DIRECTORY_WATCH) != [])  # its threads in both counts
        threads_before = counted_threads()
        fds_before = len(os.listdir("/proc/self/fd"))
        replica = f"{gpu_uuids(daemon)[0]}::0"
        for _ in range(rounds):
            statuses: list[int] = []
            scrapers = [
                threading.Thread(target=_scrape_into, args=(port, statuses), name=f"scraper-{n}")
                for n in range(SCRAPERS)
            ]
            for scraper in scrapers:
                scraper.start()
            # kubelet's call, in the middle of the flood, on the plugin's own socket
            envs = kubelet.allocate(GPU, [[replica]]).container_responses[0].envs
            assert envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuids(daemon)[0]
            for scraper in scrapers:
                scraper.join(timeout=scaled(30))
                assert not scraper.is_alive(), "a scrape hung"
            assert 200 in statuses and set(statuses) <= {200, 503}
        assert _scrape(port) == 200
        assert kubelet.wait_for(lambda: counted_threads() <= threads_before + 2, timeout=scaled(10))
        assert kubelet.wait_for(
            lambda: len(os.listdir("/proc/self/fd")) <= fds_before + 8, timeout=scaled(10)
        )
    finally:
        daemon.stop()

"""Scrapers cycling through every exposition format cost one collection per window (issue 32 item 5:
sixteen scrapers cycling through the fourteen formats made fourteen renders a second on a 62,400-device
node, and Allocate 12x slower), and every format is still served the bytes prometheus_client renders.

Work is counted (collections of the daemon's state, bodies encoded), never timed.
"""

from __future__ import annotations

import http.client
from collections.abc import Iterable
from pathlib import Path

import pytest
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder

from nvidia_device_plugin.standins.kubelet import KubeletStandIn
from nvidia_device_plugin.telemetry import metrics
from nvidia_device_plugin.telemetry.metrics import DaemonMetrics, negotiate
from nvidia_device_plugin.telemetry.scrape_bodies import ScrapeBodies

from support.checks import assert_all
from support.daemon_support import GPU, gpu_uuids, start_daemon
from support.waiting import scaled

ESCAPINGS = ("allow-utf-8", "underscores", "dots", "values")
# One Accept header for each of the fourteen formats negotiate leaves.
EVERY_FORMAT = [
    "",
    "application/openmetrics-text",
    *(f"text/plain; version=1.0.0; escaping={e}" for e in ESCAPINGS),
    *(
        f"application/openmetrics-text; version={v}; escaping={e}"
        for v in ("1.0.0", "2.0.0")
        for e in ESCAPINGS
    ),
]


def scrape(port: int, accept: str) -> tuple[int, str, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=scaled(10))
    try:
        connection.request("GET", "/metrics", headers={"Accept": accept} if accept else {})
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        connection.close()


def test_the_headers_cover_every_format() -> None:
    assert len({negotiate(h) for h in EVERY_FORMAT}) == len(EVERY_FORMAT) == 14


def test_scrapers_cycling_through_every_format_cost_one_collection_per_window(
    plugin_dir: Path, kubelet: KubeletStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    collections = 0
    collect = metrics._StateCollector.collect

    def counted(self: metrics._StateCollector) -> Iterable[Metric]:
        nonlocal collections
        collections += 1
        return collect(self)

    monkeypatch.setattr(metrics._StateCollector, "collect", counted)
    # A render cache window no slow machine can outlast.
    daemon = start_daemon(plugin_dir, metrics_address="127.0.0.1:0", metrics_render_cache_s=60.0)
    try:
        assert kubelet.wait_for_resources([GPU])
        assert daemon.probes is not None
        kubelet.allocate(GPU, [[gpu_uuids(daemon)[0]]])
        answers = {accept: scrape(daemon.probes.port, accept) for accept in EVERY_FORMAT * 3}
    finally:
        daemon.stop()
    assert_all(answers.values(), lambda answer: answer[0] == 200)
    assert collections == 1  # was 14: one per format
    assert len({body for _, _, body in answers.values()}) <= 8


def test_every_format_is_served_the_bytes_prometheus_client_renders(
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    daemon = start_daemon(plugin_dir, count_metrics=True)
    try:
        assert kubelet.wait_for_resources([GPU])
        kubelet.allocate(GPU, [[gpu_uuids(daemon)[0]]])
        assert isinstance(daemon.metrics, DaemonMetrics)
        daemon.metrics.xid_seen(gpu_uuids(daemon)[1], 79, True)
    finally:
        # Stopped before the renders are compared: a running daemon's threads (liveness checks, streams)
        # may move a sample between the cached collection and prometheus_client's own render.
        daemon.stop()
    registry = daemon.metrics.registry
    clock = [0.0]
    bodies = ScrapeBodies(registry, 60.0, clock=lambda: clock[0])
    for accept in EVERY_FORMAT:
        encoder, content_type = choose_encoder(negotiate(accept))
        assert bodies.render(accept) == (encoder(registry), content_type), accept
    assert (bodies.collections, bodies.encodes) == (1, 8)
    clock[0] = 60.0  # the next window collects again
    bodies.render("")
    assert bodies.collections == 2
    # OpenMetrics 2.0.0 is served 1.0.0's body: they differ only in native histograms.
    samples = [(family.name, sample) for family in registry.collect() for sample in family.samples]
    assert_all(samples, lambda named: named[1].native_histogram is None)

"""One /metrics render per second per exposition format, however scrapers word their Accept headers
(issue 23 item 8: a fresh Accept header per scrape made every scrape render, and Allocate 7-14x slower).

The daemon runs on a simulated node with the kubelet stand-in; scrapes go over real HTTP. A render cached
for the whole test shows as a stale body: an Allocate made after the first scrape is not in it yet.
"""

from __future__ import annotations

import http.client
from pathlib import Path

from prometheus_client.exposition import choose_encoder

from nvidia_device_plugin.standins.kubelet import KubeletStandIn
from nvidia_device_plugin.telemetry.metrics import negotiate

from support.daemon_support import GPU, gpu_uuids, start_daemon
from support.waiting import scaled

ALLOCATIONS = f'nvidia_device_plugin_allocations_total{{resource="{GPU}"}}'

# What scrapers send: the same two formats, each worded many ways.
TEXT_HEADERS = [
    "",
    "text/plain",
    "*/*",
    "text/plain;version=0.0.4;q=0.9,*/*;q=0.1",
    *(f"text/plain;version=0.0.4;q=0.{n}" for n in range(1, 10)),
    "application/openmetrics-text;version=abc,text/plain",  # prometheus_client fails on this one (500)
    "application/openmetrics-text; version=0.0.1",
]
OPENMETRICS_HEADERS = [
    "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
    "application/openmetrics-text; version=1.0.0; charset=utf-8",
    *(f"application/openmetrics-text;version=1.0.{n};q=0.9,text/plain;q=0.{n}" for n in range(1, 10)),
]


def scrape(port: int, accept: str) -> tuple[int, str, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=scaled(10))
    try:
        connection.request("GET", "/metrics", headers={"Accept": accept} if accept else {})
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read().decode()
    finally:
        connection.close()


def allocations(body: str) -> str:
    line = next(line for line in body.splitlines() if line.startswith(ALLOCATIONS))
    return line.split()[-1]


def test_fresh_accept_headers_share_one_render_per_format(plugin_dir: Path, kubelet: KubeletStandIn) -> None:
    # A render cache window no slow machine can outlast.
    daemon = start_daemon(plugin_dir, metrics_address="127.0.0.1:0", metrics_render_cache_s=60.0)
    try:
        assert kubelet.wait_for_resources([GPU])
        assert daemon.probes is not None
        port = daemon.probes.port
        kubelet.allocate(GPU, [[gpu_uuids(daemon)[0]]])  # the resource's counters exist from here on
        first_text = scrape(port, TEXT_HEADERS[0])
        first_openmetrics = scrape(port, OPENMETRICS_HEADERS[0])
        kubelet.allocate(GPU, [[gpu_uuids(daemon)[1]]])  # a change no cached render can show
        for accept in TEXT_HEADERS[1:]:
            assert scrape(port, accept) == first_text, accept
        for accept in OPENMETRICS_HEADERS[1:]:
            assert scrape(port, accept) == first_openmetrics, accept
        assert first_text[0] == 200 and first_text[1].startswith("text/plain; version=0.0.4")
        assert allocations(first_text[2]) == "1.0"
        assert first_openmetrics[1].startswith("application/openmetrics-text; version=1.0.0")
    finally:
        daemon.stop()


def test_negotiation_leaves_only_the_formats_prometheus_client_serves() -> None:
    headers = [
        *TEXT_HEADERS,
        *OPENMETRICS_HEADERS,
        *(
            f"application/openmetrics-text; version={v}; escaping={e}"
            for v in ("1.2.3", "2.0.0", "3.1")
            for e in ("dots", "values", "allow-utf-8", "x")
        ),
        *(f"text/plain; version=1.{n}.0; escaping=dots" for n in range(20)),
        "text/html, application/xhtml+xml, " * 50,
    ]
    formats = {negotiate(h) for h in headers}
    assert len(formats) <= 13, sorted(formats)
    for header in headers:
        # The format served for the reduced header is the one prometheus_client serves for the original.
        chosen = choose_encoder(negotiate(header))[1].split(";")[0]
        try:
            original = choose_encoder(header)[1].split(";")[0]
        except TypeError:  # prometheus_client cannot compare a version that is not a number
            continue
        assert chosen == original, header

"""The daemon's metrics and probe server, made only when they are used.

prometheus_client (and the HTTP server's modules) cost a `run` start-up a fifth of its time and a good part
of its memory; a daemon that neither serves /metrics nor counts in-process for a test reports its events to
`NO_EVENTS` and never imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from nvidia_device_plugin.events import NO_EVENTS, Events

if TYPE_CHECKING:
    from nvidia_device_plugin.telemetry.metrics import DaemonView
    from nvidia_device_plugin.telemetry.probes import ProbeServer


def daemon_events(daemon: DaemonView, counted: bool) -> Events:
    """The daemon's metrics (DaemonMetrics) when `counted`, else the listener that ignores everything."""
    if not counted:
        return NO_EVENTS
    from nvidia_device_plugin.telemetry.metrics import DaemonMetrics

    return DaemonMetrics(daemon)


def probe_server(
    address: str,
    events: Events,
    liveness: Callable[[], str | None],
    readiness: Callable[[], str | None],
    render_cache_s: float | None = None,
) -> ProbeServer | None:
    """/metrics, /healthz and /readyz on `address` (None when empty); `events` must count (daemon_events).
    `render_cache_s`: how long a rendered body is shared (None: probes.RENDER_CACHE_S, named only here so
    that a daemon without metrics never imports the server)."""
    if not address:
        return None
    from nvidia_device_plugin.telemetry import probes
    from nvidia_device_plugin.telemetry.metrics import DaemonMetrics, negotiate
    from nvidia_device_plugin.telemetry.scrape_bodies import ScrapeBodies

    if not isinstance(events, DaemonMetrics):
        raise TypeError("a probe server serves the metrics it is given: make them with counted=True")
    # The server caches a render per format; ScrapeBodies makes those renders share one collection per
    # window and the four bodies that exist, so scrapers cycling through formats cost what one does.
    window = probes.RENDER_CACHE_S if render_cache_s is None else render_cache_s
    bodies = ScrapeBodies(events.registry, window)
    return probes.ProbeServer(address, bodies.render, liveness, readiness, negotiate, render_cache_s=window)

"""The /metrics bodies the HTTP server hands out: one collection per window, each distinct body encoded once.

prometheus_client serves fourteen exposition formats (see metrics.negotiate), and the HTTP server caches a
render per format; sixteen scrapers cycling through them made fourteen renders a second, each walking every
advertised device (62,400 on a large node), and Allocate 12x slower. Two facts bound that work here:

* the walk is the collection (the state gauges); encoding the collected families is cheap. So the registry
  is collected at most once per window, and every body of the window is encoded from that collection;
* the fourteen formats come down to eight bodies: text or OpenMetrics, in one of four name escapings.
  Text 0.0.4 and 1.0.0 share one encoder, and OpenMetrics 2.0.0 differs from 1.0.0 only in native
  histograms, which we do not have. A test renders every format both ways and compares the bytes.

The content type answered is still the one negotiated for the client's own Accept header.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Literal, cast

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector

from nvidia_device_plugin.telemetry.metrics import OPENMETRICS, negotiate

Escaping = Literal["allow-utf-8", "underscores", "dots", "values"]
BodyKind = tuple[Literal["text", "openmetrics"], Escaping]
_ESCAPING = re.compile(r"escaping=(allow-utf-8|underscores|dots|values)\b")


def body_kind(negotiated: str) -> BodyKind:
    """The body a negotiated format (metrics.negotiate's answer) is served with."""
    family: Literal["text", "openmetrics"] = "openmetrics" if negotiated.startswith(OPENMETRICS) else "text"
    found = _ESCAPING.search(negotiated)
    escaping = cast(Escaping, found.group(1)) if found is not None else "underscores"
    return family, escaping


def encode(kind: BodyKind, collected: Collector) -> bytes:
    """The body of `kind` for what `collected` collects."""
    family, escaping = kind
    if family == "openmetrics":
        body: bytes = openmetrics.generate_latest(  # type: ignore[no-untyped-call]
            collected, escaping=escaping, version="1.0.0"
        )
        return body
    return generate_latest(collected, escaping=escaping)


class _Collected(Collector):
    """One collection of a registry, encoded as many times as there are bodies to serve from it."""

    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics


class ScrapeBodies:
    """render(accept) -> (body, content type), collecting `registry` at most once per `window_s` seconds.

    `collections` and `encodes` count the work done (the tests bound them).
    """

    def __init__(
        self, registry: CollectorRegistry, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._registry = registry
        self._window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._collected_at = 0.0
        self._collected: _Collected | None = None
        self._bodies: dict[BodyKind, bytes] = {}
        self.collections = 0
        self.encodes = 0

    def render(self, accept: str) -> tuple[bytes, str]:
        negotiated = negotiate(accept)
        _, content_type = choose_encoder(negotiated)
        kind = body_kind(negotiated)
        with self._lock:
            now = self._clock()
            if self._collected is None or now - self._collected_at >= self._window_s:
                self._collected = _Collected(list(self._registry.collect()))
                self._collected_at = now
                self._bodies.clear()
                self.collections += 1
            body = self._bodies.get(kind)
            if body is None:
                body = self._bodies[kind] = encode(kind, self._collected)
                self.encodes += 1
        return body, content_type

"""Metrics whose label sets come from outside (NVML's XID values) stay bounded."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from nvidia_device_plugin.health.registry import HealthRegistry
from nvidia_device_plugin.plugin.manager import PluginManager
from nvidia_device_plugin.telemetry.metrics import DaemonMetrics


class _NoSnapshotYet:
    """The daemon before discovery: what DaemonMetrics reads, nothing more."""

    def __init__(self, plugin_dir: Path) -> None:
        self.snapshot = None
        self.registry = HealthRegistry()
        self.manager = PluginManager(plugin_dir)


def test_unknown_xid_values_share_one_other_series(tmp_path: Path) -> None:
    metrics = DaemonMetrics(_NoSnapshotYet(tmp_path))
    metrics.xid_seen("GPU-a", 79, True)
    for xid in range(1000, 1500):  # a GPU (or a driver bug) reporting ever-new XID values
        metrics.xid_seen("GPU-a", xid, False)
    body, _ = metrics.render("")
    (family,) = [f for f in text_string_to_metric_families(body.decode()) if f.name.endswith("xid_events")]
    series = {
        (s.labels["xid"], s.labels["critical"]): s.value for s in family.samples if s.name.endswith("_total")
    }
    assert series == {("79", "true"): 1.0, ("other", "false"): 500.0}

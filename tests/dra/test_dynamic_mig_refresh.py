"""Dynamic MIG and the daemon's served snapshot (a `run` process on a100-mig-dynamic): the MIG device a
claim's Prepare makes, and its Unprepare destroys, reaches the labels file (what GFD's rules read from the
served inventory) and the health watch at once, through the one reload funnel with only that GPU read
again: the node is never re-discovered nor the config reloaded for it. And the funnel itself
(SnapshotFollower.edit): the edited inventory served under the same config, with no discovery and no
config read, and an edit that changes nothing applies nothing."""

from __future__ import annotations

import logging
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from nvidia_device_plugin import snapshot as snapshot_module
from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.loader import parse_config_text
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.daemons.follower import SnapshotFollower
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.snapshot import Snapshot
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.dra_daemon import DraApiServer, published_uuid, start_dra_daemon
from support.dra_kubelet import DraKubeletStandIn, resource_claim
from support.podresources_standin import PodResourcesStandIn
from support.waiting import wait_for

UID = "0f3c6b1e-3333-4a5e-9d7e-000000000032"
CLAIM = ("default", "mig-claim", UID)
DEVICE = "gpu-0-mig-1g10gb-19-6"  # 1g.10gb at slice 6 of GPU 0 (minor 0)
MIG_COUNT = "nvidia.com/mig-1g.10gb.count"  # GFD's label under the mixed strategy, for the made device


@pytest.fixture
def api() -> Iterator[DraApiServer]:
    with DraApiServer() as server:
        yield server


def _start(root: Path, api: DraApiServer, pods: PodResourcesStandIn, log: Path) -> subprocess.Popen[str]:
    flags = ("--dra", "--dra-dynamic-mig", "--mig-strategy", "mixed", "--labels-file", str(root / "labels"))
    return start_dra_daemon(root, api, pods, log, "a100-mig-dynamic", *flags)


def mig_count(labels_file: Path) -> int:
    """The MIG_COUNT label's value in the labels file (0 while absent, or while the file is not written)."""
    if not labels_file.exists():
        return 0
    for line in labels_file.read_text().splitlines():
        key, _, value = line.partition("=")
        if key == MIG_COUNT:
            return int(value)
    return 0


def test_a_made_mig_device_reaches_the_labels_without_a_rediscovery(
    plugin_dir: Path, kubelet: KubeletStandIn, api: DraApiServer
) -> None:
    (plugin_dir / "pod-resources").mkdir()
    log, labels = plugin_dir / "daemon.log", plugin_dir / "labels"
    with (
        PodResourcesStandIn(plugin_dir / "pod-resources" / "kubelet.sock") as pods,
        DraKubeletStandIn(plugin_dir / "plugins_registry") as dra,
    ):
        process = _start(plugin_dir, api, pods, log)
        try:
            wait_for(lambda: published_uuid(api, DEVICE) == "", "the placement to be published, unmade")
            wait_for(labels.exists, "the labels file")
            assert mig_count(labels) == 0, labels.read_text()
            api.claims.put(resource_claim(UID, name="mig-claim", results=[("mig", DEVICE)]))
            answer = dra.prepare([CLAIM])[UID]
            assert answer.error == "", answer.error
            wait_for(lambda: mig_count(labels) == 1, "the made MIG device in the labels file")
            wait_for(lambda: (published_uuid(api, DEVICE) or "").startswith("MIG-"), "the made device's UUID")
            assert dra.unprepare([CLAIM])[UID].error == ""
            wait_for(lambda: mig_count(labels) == 0, "the destroyed MIG device gone from the labels file")
            wait_for(lambda: published_uuid(api, DEVICE) == "", "the placement published unmade again")
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(30)
            print(log.read_text())  # shown on failure
    text = log.read_text()
    assert "inventory updated (MIG device MIG-" in text and " made on GPU 0)" in text, text
    assert " destroyed on GPU 0)" in text, text
    assert "node re-discovered" not in text and "config reloaded" not in text, text
    # The health watch follows too: a monitor for the inventory at start, after the make, after the destroy.
    assert text.count("health monitor started") == 3, text


def _no_config() -> Config:
    raise AssertionError("the config was read again")


def test_an_inventory_edit_is_served_under_the_same_config_without_discovery(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    session = open_nvml("a100-mig-dynamic")
    try:
        applied: list[tuple[Snapshot, Snapshot]] = []

        results: list[tuple[bool, str]] = []
        follower = SnapshotFollower(
            _no_config,
            lambda new, old: applied.append((new, old)),
            on_result=lambda ok, message: results.append((ok, message)),
        )
        first = follower.first(session, parse_config_text("version: v1\n"))
        discovered: list[object] = []
        monkeypatch.setattr(snapshot_module, "discover", lambda *args: discovered.append(args))
        assert len(first.inventory.gpus) > 1
        kept = first.inventory.gpus[0]
        with caplog.at_level(logging.INFO):
            assert follower.edit("MIG device made on GPU 0", lambda inv: replace(inv, gpus=(kept,)))
        [(new, old)] = applied
        assert old is first and new.config is first.config and discovered == []
        assert new.inventory.gpus == (kept,) and follower.current[0] is new
        assert {d.gpu_uuid for p in new.plans for d in p.devices} == {kept.uuid}
        assert "inventory updated (MIG device made on GPU 0)" in caplog.text
        assert results == []  # not a config reload (the config_reloads metric)
    finally:
        session.close()


def test_an_inventory_edit_that_changes_nothing_applies_nothing() -> None:
    session = open_nvml("a100-mig-dynamic")
    try:
        applied: list[tuple[Snapshot, Snapshot]] = []
        follower = SnapshotFollower(_no_config, lambda new, old: applied.append((new, old)))
        first = follower.first(session, parse_config_text("version: v1\n"))
        assert follower.edit("MIG devices read again on GPU 0", lambda inventory: inventory)
        assert applied == [] and follower.current[0] is first
    finally:
        session.close()


def test_a_refused_inventory_edit_keeps_the_snapshot_served(caplog: pytest.LogCaptureFixture) -> None:
    session = open_nvml("a100-mig-dynamic")
    try:
        refusing = False

        def check(snapshot: Snapshot) -> Snapshot:
            if refusing:
                raise ConfigError("no such thing here")
            return snapshot

        applied: list[tuple[Snapshot, Snapshot]] = []
        follower = SnapshotFollower(_no_config, lambda new, old: applied.append((new, old)), check=check)
        first = follower.first(session, parse_config_text("version: v1\n"))
        refusing = True
        kept = first.inventory.gpus[0]
        assert not follower.edit("MIG device made on GPU 0", lambda inv: replace(inv, gpus=(kept,)))
        assert applied == [] and follower.current[0] is first
        assert "inventory update (MIG device made on GPU 0) rejected" in caplog.text
        assert "no such thing here" in caplog.text
    finally:
        session.close()

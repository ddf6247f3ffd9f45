"""The daemon owns every thread it starts (one WorkerGroup), stops every one of them, and says so when one
dies: in its log and on /healthz. In-process daemon on a simulated node, kubelet stand-in and probes over
real sockets."""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from nvidia_device_plugin.base.workers import Worker
from nvidia_device_plugin.config.loader import parse_config_text
from nvidia_device_plugin.config.source import ConfigSource
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.config.watch import ConfigWatcher
from nvidia_device_plugin.daemons.run import Daemon
from nvidia_device_plugin.labels.writer import LabelsOptions
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU, simulated_options, start_daemon
from support.waiting import scaled, wait_for

# The threads of a daemon with probes, a watched config file and a labels file on a GPU node.
DAEMON_THREADS = {
    "probes-http",
    "config-watcher",
    "labels-writer",
    "plugin-registrar",
    "nvml-health",
}
# Its workers whose thread is made only when work for it comes (Worker.start_thread): a reload to retry,
# a health line left out (the rate-limited health lines' summaries), a GPU discovery could not read.
PUT_OFF = {"reload-retry", "log-summaries", "gpu-rediscovery"}


def thread_names(since: set[threading.Thread] | None = None) -> set[str]:
    """Names of the live threads (started after `since`, when given)."""
    return {t.name for t in threading.enumerate() if since is None or t not in since}


def healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=scaled(5)) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_every_thread_the_daemon_starts_is_its_own_and_gone_after_stop(
    tmp_path: Path, plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    source = ConfigSource.from_file(config)
    before = set(threading.enumerate())
    daemon = start_daemon(
        plugin_dir,
        load_config=lambda: source.load({}),
        watch=lambda on_change, defer: ConfigWatcher(source, on_change, defer_events=defer),
        metrics_address="127.0.0.1:0",
        labels=LabelsOptions(path=tmp_path / "labels", machine_type_file=""),
    )
    try:
        assert kubelet.wait_for_resources([GPU])
        assert thread_names(before) >= DAEMON_THREADS
        assert not PUT_OFF & thread_names(before)
        assert "mps-readiness" not in thread_names(before)  # no MPS plan: not even a worker
        # kubelet lists the devices from the stream it opens inside Register, a moment before the
        # registrar reads Register's answer: until then liveness says "registration in progress".
        wait_for(lambda: daemon.liveness() is None, "liveness once registered")
        assert {getattr(w, "name", "") for w in daemon.workers} >= (DAEMON_THREADS | PUT_OFF) - {
            "plugin-registrar"
        }
    finally:
        daemon.stop()
    assert not (DAEMON_THREADS | PUT_OFF) & thread_names(before)


def test_the_mps_readiness_thread_joins_the_daemons_workers_when_it_serves_mps(
    tmp_path: Path, plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    mps = parse_config_text(
        f"version: v1\nflags:\n  mpsRoot: {tmp_path / 'mps'}\nsharing:\n  mps:\n"
        f"    resources:\n    - name: {GPU}\n      replicas: 2\n"
    )
    configs = [Config(), mps]
    before = set(threading.enumerate())
    daemon = start_daemon(plugin_dir, load_config=lambda: configs[0])
    try:
        assert kubelet.wait_for_resources([GPU])
        assert "mps-readiness" not in thread_names(before)
        configs[0] = mps
        assert daemon.reload("test: MPS")
        assert "mps-readiness" in thread_names(before)
        assert "mps-readiness" in {getattr(w, "name", "") for w in daemon.workers}
        configs[0] = Config()
        assert daemon.reload("test: no MPS")  # the watcher stays, watching nothing
        assert "mps-readiness" in thread_names(before)
    finally:
        daemon.stop()
    assert "mps-readiness" not in thread_names(before)


def test_a_worker_that_dies_is_logged_and_fails_the_liveness_probe(
    plugin_dir: Path, kubelet: KubeletStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    def feeder_with_a_bug(stop: threading.Event) -> None:
        raise RuntimeError("feeder bug")

    caplog.set_level(logging.ERROR, logger="nvidia_device_plugin.base.workers")
    before = set(threading.enumerate())
    daemon = start_daemon(
        plugin_dir, metrics_address="127.0.0.1:0", simulated_events=Worker("sim-events", feeder_with_a_bug)
    )
    try:
        assert kubelet.wait_for_resources([GPU])
        assert daemon.probes is not None
        port = daemon.probes.port
        wait_for(lambda: healthz(port)[0] == 503, "the liveness probe to fail")
        assert healthz(port) == (503, "thread sim-events ended: RuntimeError: feeder bug\n")
        assert "thread sim-events ended with an unexpected error" in caplog.text
        assert len(kubelet.devices(GPU)) == 8  # the rest goes on serving until the pod is restarted
    finally:
        daemon.stop()
    assert not (DAEMON_THREADS | {"sim-events"}) & thread_names(before)


def test_a_start_that_fails_stops_what_it_started(plugin_dir: Path) -> None:
    class NoChoice(Worker):
        def setup(self) -> bool:
            raise RuntimeError("a label naming no config")

    before = set(threading.enumerate())
    daemon = Daemon(
        simulated_options(plugin_dir, metrics_address="127.0.0.1:0", node_config=NoChoice("node-label-watch"))
    )
    with pytest.raises(RuntimeError, match="a label naming no config"):
        daemon.start()
    assert "probes-http" in thread_names(before)  # started before the node-label follower, as listed
    daemon.stop()  # as serve_until_stopped does when the start raises
    assert not (DAEMON_THREADS | {"node-label-watch"}) & thread_names(before)

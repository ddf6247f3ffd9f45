"""One NVML call that never returns (a driver in a GPU reset) costs that GPU, never the node: the other
GPUs' health keeps flowing, reloads finish, the stuck call is named in the log and a metric.

The daemon runs in process on a simulated dgx-a100 with a short NVML call deadline; hangs come from the
simulated events feed (as an operator's `--simulate-events` file) or from a node file, and kubelet's view is
the stand-in's, over the real sockets. Every hang is released at the end, so no thread stays blocked.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path

import pytest
import yaml

from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.daemons.run import Daemon, DaemonOptions
from nvidia_device_plugin.nvml.session import NvmlSession, open_nvml
from nvidia_device_plugin.nvml.sim.events import SimulatedEventFeeder
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.checks import assert_all
from support.daemon_support import GPU, gpu_uuids
from support.waiting import NVML_CALL_DEADLINE_S, wait_for


@pytest.fixture
def sessions() -> Iterator[list[NvmlSession]]:
    opened: list[NvmlSession] = []
    yield opened
    for session in opened:
        if session.simulator is not None:
            session.simulator.release()


def _session(node: str, sessions: list[NvmlSession]) -> NvmlSession:
    session = open_nvml(node, call_timeout_s=NVML_CALL_DEADLINE_S)
    sessions.append(session)
    return session


def _daemon(plugin_dir: Path, session: NvmlSession, events: Path | None = None) -> Daemon:
    assert session.simulator is not None
    feeder = SimulatedEventFeeder(events, session.simulator, poll_interval_s=0.01) if events else None
    options = DaemonOptions(
        plugin_dir=plugin_dir,
        load_config=Config,
        open_nvml=lambda: session,
        metrics_address="127.0.0.1:0",
        simulated_events=feeder,
    )
    return Daemon(options)


def _returns(call: Callable[[], object], what: str) -> object:
    """`call()` on a thread; the test fails, instead of hanging, when it never returns."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    wait_for(lambda: not thread.is_alive(), what)
    return result[0] if result else None


def _append(path: Path, *lines: dict[str, object]) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write("".join(json.dumps(line) + "\n" for line in lines))


def _health(kubelet: KubeletStandIn, uuid: str) -> str:
    device = kubelet.devices(GPU).get(uuid)
    return device.health if device is not None else "missing"


def _stuck_gauge(daemon: Daemon, call: str) -> str | None:
    text = daemon.metrics.render("text/plain")[0].decode()
    prefix = f'nvidia_device_plugin_nvml_stuck_calls{{call="{call}"}} '
    return next((line.removeprefix(prefix) for line in text.splitlines() if line.startswith(prefix)), None)


def test_a_call_hung_on_one_gpu_leaves_the_others_health_flowing_and_reloads_finishing(
    tmp_path: Path,
    plugin_dir: Path,
    kubelet: KubeletStandIn,
    sessions: list[NvmlSession],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    events = tmp_path / "events.jsonl"
    events.touch()
    daemon = _daemon(plugin_dir, _session("dgx-a100", sessions), events)
    daemon.start()
    try:
        assert kubelet.wait_for_resources([GPU])
        uuids = gpu_uuids(daemon)
        # GPU 2 goes into a reset: reading its ECC counters (what marking it unhealthy does) hangs.
        _append(events, {"gpu": 2, "hang": "nvmlDeviceGetTotalEccErrors"}, {"gpu": 2, "xid": 79})
        assert kubelet.wait_for(lambda: _health(kubelet, uuids[2]) == "Unhealthy")
        _append(events, {"gpu": 5, "xid": 79})  # another GPU's XID is still seen
        assert kubelet.wait_for(lambda: _health(kubelet, uuids[5]) == "Unhealthy")
        assert _health(kubelet, uuids[0]) == "Healthy"

        assert _returns(lambda: daemon.reload("test"), "a reload while GPU 2 is stuck") is True
        assert len(kubelet.devices(GPU)) == 8  # GPU 2 still served, as before
        assert kubelet.wait_for(lambda: _health(kubelet, uuids[2]) == "Unhealthy")
        assert _stuck_gauge(daemon, "nvmlDeviceGetTotalEccErrors") == "1.0"
        stuck = [r.getMessage() for r in caplog.records if "nvmlDeviceGetTotalEccErrors" in r.getMessage()]
        assert any("GPU 2" in line and "stuck" in line for line in stuck), stuck

        _append(events, {"gpu": 2, "release": "nvmlDeviceGetTotalEccErrors"})
        wait_for(lambda: _stuck_gauge(daemon, "nvmlDeviceGetTotalEccErrors") == "0.0", "the call returned")
    finally:
        daemon.stop()


def test_a_call_hung_from_the_start_by_the_node_file_still_lets_the_daemon_serve(
    tmp_path: Path, plugin_dir: Path, kubelet: KubeletStandIn, sessions: list[NvmlSession]
) -> None:
    preset = resources.files("nvidia_device_plugin.nvml.sim.presets").joinpath("dgx-a100.json")
    node = json.loads(preset.read_text())
    node["hangs"] = [{"call": "nvmlDeviceGetMemoryInfo", "gpu": 3}]  # until released
    node_file = tmp_path / "node.yaml"
    node_file.write_text(yaml.safe_dump(node))
    session = _returns(lambda: _session(str(node_file), sessions), "NVML to open")
    assert isinstance(session, NvmlSession)
    daemon = _daemon(plugin_dir, session)
    assert _returns(daemon.start, "the daemon to start") is None
    try:
        assert kubelet.wait_for_resources([GPU])
        uuids = gpu_uuids(daemon)
        assert len(kubelet.devices(GPU)) == 8
        assert kubelet.wait_for(lambda: _health(kubelet, uuids[3]) == "Unhealthy")
        assert_all([u for i, u in enumerate(uuids) if i != 3], lambda u: _health(kubelet, u) == "Healthy")
        assert daemon.snapshot is not None
        problems = [p.message for p in daemon.snapshot.inventory.problems if p.gpu_index == 3]
        assert any("nvmlDeviceGetMemoryInfo" in m and "stuck" in m for m in problems), problems
    finally:
        daemon.stop()


def _slow_count(daemon: Daemon, call: str) -> float:
    text = daemon.metrics.render("text/plain")[0].decode()
    prefix = f'nvidia_device_plugin_nvml_slow_calls_total{{call="{call}"}} '
    return sum(float(line.removeprefix(prefix)) for line in text.splitlines() if line.startswith(prefix))


def test_a_call_slow_but_under_its_deadline_is_counted_and_logged_with_its_gpu(
    plugin_dir: Path, kubelet: KubeletStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    session = open_nvml("dgx-a100", call_timeout_s=4.0)  # slow from 1 s
    daemon = _daemon(plugin_dir, session)
    assert session.simulator is not None
    daemon.start()
    try:
        assert kubelet.wait_for_resources([GPU])
        # A read of GPU 4 through the daemon's NVML takes 2 s: held, not stuck, and not silent either.
        session.simulator.hang("nvmlDeviceGetMemoryInfo", 4, seconds=2.0)
        handle = session.nv.nvmlDeviceGetHandleByIndex(4)
        assert _returns(lambda: session.nv.nvmlDeviceGetMemoryInfo(handle), "the slow read") is not None
        wait_for(lambda: _slow_count(daemon, "nvmlDeviceGetMemoryInfo") >= 1, "the slow call to be counted")
        slow = [r.getMessage() for r in caplog.records if "was slow" in r.getMessage()]
        assert any("nvmlDeviceGetMemoryInfo on GPU 4" in line for line in slow), slow
        assert _health(kubelet, gpu_uuids(daemon)[4]) == "Healthy"
    finally:
        daemon.stop()
        session.simulator.release()

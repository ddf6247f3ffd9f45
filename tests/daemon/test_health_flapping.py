"""A GPU that flaps (recovery with `gracePeriod: 0`, an XID every few milliseconds) costs kubelet a bounded
number of ListAndWatch pushes and the log a bounded number of lines (issue 23 item 15: ~800 pushes and
~20,000 lines in 10 s). The last state always arrives.

In-process daemon on a simulated node, XIDs from the pynvml simulator, the kubelet stand-in counting the
ListAndWatch messages it receives over the real socket.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from nvidia_device_plugin.base import logs
from nvidia_device_plugin.config.v1 import Config, Recovery
from nvidia_device_plugin.config.v1 import Health as HealthConfig
from nvidia_device_plugin.plugin import streams
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU, gpu_uuids, simulator, start_daemon
from support.markers import soak

FLAPPING = Config(health=HealthConfig(recovery=Recovery(enabled=True, grace_period_seconds=0)))


@pytest.mark.parametrize("xids", [300, soak(20_000)])
def test_a_flapping_gpu_costs_bounded_pushes_and_log_lines_and_the_last_state_arrives(
    plugin_dir: Path,
    kubelet: KubeletStandIn,
    caplog: pytest.LogCaptureFixture,
    xids: int,
) -> None:
    caplog.set_level(logging.INFO, logger="nvidia_device_plugin.daemons.run")
    daemon = start_daemon(plugin_dir, load_config=lambda: FLAPPING)
    try:
        assert kubelet.wait_for_resources([GPU])
        sim, uuids = simulator(daemon), gpu_uuids(daemon)
        pushes_before = kubelet.plugin(GPU).updates
        caplog.clear()
        started = time.monotonic()
        for n in range(xids):
            sim.inject_xid(n % 2, 48)  # GPUs 0 and 1, each unhealthy and at once healthy again
            time.sleep(0.005)
        # The storm is over: the last state (every GPU healthy) reaches kubelet.
        assert kubelet.wait_for(lambda: {d.health for d in kubelet.devices(GPU).values()} == {"Healthy"})
        elapsed = time.monotonic() - started
        pushes = kubelet.plugin(GPU).updates - pushes_before
        # A burst, then one per interval at most (bounded by how long the storm took, however slow).
        assert pushes <= streams.PUSH_BURST + elapsed / streams.PUSH_INTERVAL_S + 2, (pushes, elapsed)
        lines = [r for r in caplog.records if "healthy" in r.getMessage() and uuids[0] in r.getMessage()]
        # A burst and one summary line per window of the storm (the soak's storm spans many windows).
        windows = int(elapsed // logs.RATE_LIMIT_WINDOW_S) + 1
        assert 0 < len(lines) <= windows * (logs.RATE_LIMIT_BURST + 1), (len(lines), elapsed)
    finally:
        daemon.stop()

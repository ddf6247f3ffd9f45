"""base/collector: the cyclic collector is off from the daemon's imports until it serves, then on again
with what start-up made frozen; checked in this process and in a real `run` on a simulated node."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvidia_device_plugin.base import collector
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU
from support.programs import output_of_a_served_run


@pytest.fixture
def collector_state() -> Iterator[None]:
    enabled = gc.isenabled()
    try:
        yield
    finally:
        gc.unfreeze()  # this test process's objects go back to the collector
        if enabled:
            gc.enable()
        else:
            gc.disable()


def test_hold_turns_the_collector_off_and_the_release_freezes_and_turns_it_on(collector_state: None) -> None:
    gc.enable()
    release = collector.hold()
    assert not gc.isenabled()
    frozen_before = gc.get_freeze_count()
    release()
    assert gc.isenabled()
    assert gc.get_freeze_count() > frozen_before
    gc.disable()
    release()  # a second release changes nothing
    assert not gc.isenabled()


def test_holding_a_collector_that_is_off_changes_nothing(collector_state: None) -> None:
    gc.disable()
    frozen_before = gc.get_freeze_count()
    release = collector.hold()
    release()
    assert not gc.isenabled()
    assert gc.get_freeze_count() == frozen_before


# Runs `run` through the real entry point. When the main thread first waits for a signal (the daemon has
# started and serves), it notes whether the collector is on and how many objects are frozen; printed at exit.
_REPORT_COLLECTOR = """
import atexit, gc, json, signal, sys
seen = []
sigwait = signal.sigwait
def noting_sigwait(signals):
    seen.append([gc.isenabled(), gc.get_freeze_count()])
    return sigwait(signals)
signal.sigwait = noting_sigwait
atexit.register(lambda: print("GC " + json.dumps(seen[0]), flush=True))
from nvidia_device_plugin.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_run_serves_with_the_collector_on_and_its_start_up_frozen(
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    argv = [
        "run",
        "--simulate",
        "t4-single",
        "--device-plugin-path",
        str(plugin_dir),
        "--metrics-address",
        "",
    ]
    output = output_of_a_served_run(_REPORT_COLLECTOR, argv, kubelet, [GPU])
    enabled, frozen = json.loads(next(line for line in output.splitlines() if line.startswith("GC "))[3:])
    assert enabled
    assert frozen > 10_000, frozen  # the modules, classes, config and plans of start-up

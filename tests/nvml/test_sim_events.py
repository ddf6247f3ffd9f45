from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvidia_device_plugin.config.v1 import Health
from nvidia_device_plugin.health.monitor import HealthMonitor
from nvidia_device_plugin.health.policy import REASON_LOST
from nvidia_device_plugin.health.registry import HealthRegistry
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.sim.events import MalformedEvent, SimEvent, SimulatedEventFeeder, parse_event
from nvidia_device_plugin.nvml.sim.node import load_node
from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml

from support.threads import threads_named
from support.waiting import wait_for

FEEDER_LOG = "nvidia_device_plugin.nvml.sim.events"

Call = tuple[str, int | str, int | bool | None]


class Recorder:
    """The simulator controls, recorded (the feeder's only boundary)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def inject_xid(self, target: int | str, xid: int) -> None:
        self.calls.append(("xid", target, xid))

    def inject_ecc_double_bit(self, target: int | str) -> None:
        self.calls.append(("ecc", target, None))

    def set_lost(self, target: int | str, lost: bool) -> None:
        if target == 99:
            raise ValueError("no simulated GPU or MIG device 99")
        self.calls.append(("lost", target, lost))


def append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(text)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == FEEDER_LOG and r.levelno >= logging.WARNING]


@pytest.fixture
def events(tmp_path: Path) -> Path:
    return tmp_path / "events.jsonl"


# ---- parsing ----------------------------------------------------------------------------------------


def test_parse_each_kind_of_event() -> None:
    assert parse_event('{"gpu": 0, "xid": 79}') == SimEvent(target=0, kind="xid", xid=79)
    assert parse_event('{"gpu": "MIG-abc", "xid": 94}') == SimEvent(target="MIG-abc", kind="xid", xid=94)
    assert parse_event('{"gpu": 3, "lost": true}') == SimEvent(target=3, kind="lost", lost=True)
    assert parse_event('{"gpu": 3, "lost": false}') == SimEvent(target=3, kind="lost", lost=False)
    assert parse_event('{"gpu": 1, "ecc": "double-bit"}') == SimEvent(target=1, kind="ecc")


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("{gpu: 0}", "not JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"xid": 79}', '"gpu" must be'),
        ('{"gpu": true, "xid": 79}', '"gpu" must be'),
        ('{"gpu": -1, "xid": 79}', '"gpu" must be >= 0'),
        ('{"gpu": 0}', "exactly one of"),
        ('{"gpu": 0, "xid": 79, "lost": true}', "exactly one of"),
        ('{"gpu": 0, "xid": "79"}', '"xid" must be a non-negative integer'),
        ('{"gpu": 0, "xid": true}', '"xid" must be a non-negative integer'),
        ('{"gpu": 0, "ecc": "single-bit"}', '"ecc" must be "double-bit"'),
        ('{"gpu": 0, "lost": 1}', '"lost" must be true or false'),
        ('{"gpu": 0, "xid": 79, "when": 5}', 'unknown field "when"'),
    ],
)
def test_parse_rejects_malformed_lines(line: str, complaint: str) -> None:
    with pytest.raises(MalformedEvent, match=complaint):
        parse_event(line)


# ---- following the file -----------------------------------------------------------------------------


def test_a_file_that_appears_later_is_read_from_its_start(events: Path) -> None:
    sink = Recorder()
    feeder = SimulatedEventFeeder(events, sink)
    feeder.poll()
    assert sink.calls == []
    events.write_text('{"gpu": 0, "xid": 79}\n{"gpu": 1, "ecc": "double-bit"}\n')
    feeder.poll()
    append(events, '{"gpu": 2, "lost": true}\n')
    feeder.poll()
    assert sink.calls == [("xid", 0, 79), ("ecc", 1, None), ("lost", 2, True)]
    assert feeder.applied_events == 3


def test_a_partial_last_line_waits_for_its_newline(events: Path) -> None:
    sink = Recorder()
    feeder = SimulatedEventFeeder(events, sink)
    events.write_text('{"gpu": 0, "xid": 79}\n{"gpu": 1, ')
    feeder.poll()
    assert sink.calls == [("xid", 0, 79)]
    append(events, '"xid": 48}')
    feeder.poll()
    assert sink.calls == [("xid", 0, 79)]
    append(events, "\n")
    feeder.poll()
    assert sink.calls == [("xid", 0, 79), ("xid", 1, 48)]


def test_malformed_lines_are_logged_once_each_with_their_line_and_skipped(
    events: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=FEEDER_LOG)
    sink = Recorder()
    feeder = SimulatedEventFeeder(events, sink)
    with events.open("wb") as f:
        f.write(b'{"gpu": 0, "xid": 79}\n')
        f.write(b"not json\n")
        f.write(b"\n")  # blank lines are fine
        f.write(b"\xff\xfe\n")
        f.write(b'{"gpu": 99, "lost": true}\n')  # the simulator has no GPU 99
        f.write(b'{"gpu": 0, "lost": "yes"}\n')
        f.write(b'{"gpu": 5, "xid": 13}\n')
    feeder.poll()
    feeder.poll()
    assert sink.calls == [("xid", 0, 79), ("xid", 5, 13)]
    logged = warnings(caplog)
    assert len(logged) == 4
    for line_number, message in zip((2, 4, 5, 6), logged, strict=True):
        assert f"line {line_number} skipped" in message and str(events) in message
    assert "not UTF-8" in logged[1] and "no simulated GPU or MIG device 99" in logged[2]


def test_a_truncated_file_is_read_again_from_its_start(
    events: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=FEEDER_LOG)
    sink = Recorder()
    feeder = SimulatedEventFeeder(events, sink)
    events.write_text('{"gpu": 0, "xid": 79}\n{"gpu": 1, "xid": 79}\n{"gpu": 2, "xid": 79}\n')
    feeder.poll()
    events.write_text('oops\n{"gpu": 3, "xid": 48}\n')
    feeder.poll()
    assert sink.calls[3:] == [("xid", 3, 48)]
    assert "line 1 skipped" in warnings(caplog)[0]  # numbering restarts with the new content


def test_a_replaced_or_recreated_file_is_read_from_its_start(events: Path) -> None:
    sink = Recorder()
    feeder = SimulatedEventFeeder(events, sink)
    events.write_text('{"gpu": 0, "xid": 79}\n{"gpu": 0, "xid": 79}\n')
    feeder.poll()
    staged = events.with_suffix(".new")
    staged.write_text('{"gpu": 1, "xid": 31}\n{"gpu": 1, "xid": 31}\n{"gpu": 1, "xid": 31}\n')
    os.replace(staged, events)  # same size class, different file
    feeder.poll()
    events.unlink()
    feeder.poll()
    events.write_text('{"gpu": 2, "lost": false}\n')
    feeder.poll()
    assert sink.calls == [("xid", 0, 79)] * 2 + [("xid", 1, 31)] * 3 + [("lost", 2, False)]


def test_an_overlong_line_is_skipped_without_holding_it(
    events: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=FEEDER_LOG)
    sink = Recorder()
    feeder = SimulatedEventFeeder(events, sink)
    events.write_text('{"gpu": 0, "xid": 79}\n{"gpu": 0, "pad": "' + "x" * 100_000)
    feeder.poll()
    append(events, "y" * 100_000)
    feeder.poll()
    append(events, '"}\nbad\n{"gpu": 1, "xid": 79}\n')
    feeder.poll()
    assert sink.calls == [("xid", 0, 79), ("xid", 1, 79)]
    logged = warnings(caplog)
    assert len(logged) == 2
    assert "line 2 is longer than" in logged[0] and "line 3 skipped" in logged[1]


def test_the_thread_follows_the_file_and_stops(events: Path) -> None:
    sink = Recorder()
    feeder = SimulatedEventFeeder(events, sink, poll_interval_s=0.01)
    feeder.start()
    try:
        assert threads_named("sim-events")
        append(events, json.dumps({"gpu": 4, "xid": 79}) + "\n")
        wait_for(lambda: sink.calls == [("xid", 4, 79)], "the event to be applied")
    finally:
        feeder.stop()
    assert not threads_named("sim-events")


# ---- end to end through the simulator and the real health loop --------------------------------------


@pytest.fixture
def sim() -> Iterator[SimulatedNvml]:
    nv = SimulatedNvml(load_node("a100-mig-mixed"))
    nv.nvmlInit()
    yield nv
    nv.nvmlShutdown()
    nv.close()


def test_events_from_the_file_reach_the_health_registry(events: Path, sim: SimulatedNvml) -> None:
    inventory = discover(sim, sim.materialize_host().sysfs_root)
    registry = HealthRegistry()
    monitor = HealthMonitor(sim, inventory, Health(), registry, wait_timeout_ms=20, poll_interval_s=0.01)
    feeder = SimulatedEventFeeder(events, sim, poll_interval_s=0.01)
    monitor.start()
    feeder.start()
    try:
        mig = inventory.gpus[1].mig_devices[0]
        lines = [{"gpu": 0, "xid": 79}, {"gpu": mig.uuid, "xid": 94}, {"gpu": 3, "lost": True}]
        append(events, "".join(json.dumps(line) + "\n" for line in lines))
        expected = {inventory.gpus[0].uuid, mig.uuid, inventory.gpus[3].uuid}
        wait_for(lambda: set(registry.unhealthy()) == expected, "the three devices to be unhealthy")
        assert registry.unhealthy()[inventory.gpus[3].uuid] == REASON_LOST
    finally:
        feeder.stop()
        monitor.stop()


def test_a_line_nested_too_deep_is_logged_escaped_and_the_feeder_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from nvidia_device_plugin.nvml.sim.events import SimulatedEventFeeder

    class Sink:
        def __init__(self) -> None:
            self.xids: list[tuple[int | str, int]] = []

        def inject_xid(self, target: int | str, xid: int) -> None:
            self.xids.append((target, xid))

        def inject_ecc_double_bit(self, target: int | str) -> None: ...

        def set_lost(self, target: int | str, lost: bool) -> None: ...

    path = tmp_path / "events.jsonl"
    path.write_text("[" * 100_000 + "\n" + '{"gpu": 0, "xid": 79}\n')
    sink = Sink()
    feeder = SimulatedEventFeeder(path, sink)
    feeder.poll()
    assert sink.xids == [(0, 79)]
    (line,) = [r.getMessage() for r in caplog.records if "line 1 skipped" in r.getMessage()]
    assert "RecursionError" in line and len(line) < 400

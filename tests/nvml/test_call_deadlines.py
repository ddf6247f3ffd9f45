"""The NVML call deadline as an operator sets it (--nvml-call-deadline), slow calls well under it counted and
logged, and a stop that never waits on a hung call (nvml/bounded.py)."""

from __future__ import annotations

import argparse
import logging
import threading
from collections.abc import Iterator

import pynvml
import pytest

from nvidia_device_plugin.cli.main import build_parser
from nvidia_device_plugin.cli.run import nvml_call_deadline
from nvidia_device_plugin.nvml import events as nvml_events
from nvidia_device_plugin.nvml.bounded import NvmlShuttingDown
from nvidia_device_plugin.nvml.errors import NvmlErrorKind, classify
from nvidia_device_plugin.nvml.session import NvmlSession, open_nvml

from support.waiting import wait_for

BOUNDED_LOG = "nvidia_device_plugin.nvml.bounded"


@pytest.fixture
def session() -> Iterator[NvmlSession]:
    # Slow from a quarter of the deadline, 1 s here (the default's is 2.5 s: the same rule, a shorter wait).
    opened = open_nvml("dgx-a100", call_timeout_s=4.0)
    yield opened
    opened.close()


def _lines(caplog: pytest.LogCaptureFixture, containing: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == BOUNDED_LOG and containing in r.getMessage()]


def test_a_call_slower_than_a_quarter_of_its_deadline_is_counted_and_logged_once_a_minute(
    session: NvmlSession, caplog: pytest.LogCaptureFixture
) -> None:
    assert session.simulator is not None and session.calls is not None
    caplog.set_level(logging.WARNING, logger=BOUNDED_LOG)
    slow: list[tuple[str, str]] = []
    session.calls.subscribe_slow(lambda call, where, seconds: slow.append((call, where)))
    handle = session.nv.nvmlDeviceGetHandleByIndex(1)
    uuid = session.nv.nvmlDeviceGetUUID(handle)
    assert session.nv.nvmlDeviceGetName(handle) and slow == []  # a fast call is not counted
    # Over a quarter, under the deadline, with a second to spare either way: the hang's end is set now, so a
    # pause before the call shortens what the call takes.
    session.simulator.hang("nvmlDeviceGetMemoryInfo", 1, seconds=2.0)
    assert session.nv.nvmlDeviceGetMemoryInfo(handle).total > 0
    assert slow == [("nvmlDeviceGetMemoryInfo", "GPU 1")]
    (line,) = _lines(caplog, "was slow")
    assert "nvmlDeviceGetMemoryInfo on GPU 1 was slow" in line and "deadline 4s" in line, line
    # The same call again, inside a job (a liveness check): counted, but not logged again this minute.
    session.simulator.hang("nvmlDeviceGetMemoryInfo", 1, seconds=2.0)
    assert nvml_events.probe(session.nv, uuid).state == "ok"
    assert slow == [("nvmlDeviceGetMemoryInfo", "GPU 1")] * 2
    assert len(_lines(caplog, "was slow")) == 1


def test_stop_waiting_lets_a_caller_of_a_hung_call_go_at_once_and_shutdown_names_the_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=BOUNDED_LOG)
    session = open_nvml("dgx-a100", call_timeout_s=600.0)  # the longest deadline the flag allows
    assert session.simulator is not None and session.calls is not None
    calls, simulator = session.calls, session.simulator
    try:
        handle = session.nv.nvmlDeviceGetHandleByIndex(3)
        simulator.hang("nvmlDeviceGetMemoryInfo", 3)
        simulator.hang("nvmlShutdown")  # a real driver's shutdown waits on the call its reset holds
        failed: list[BaseException] = []

        def caller() -> None:
            try:
                session.nv.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError as exc:
                failed.append(exc)

        waiting = threading.Thread(target=caller, daemon=True)
        waiting.start()
        wait_for(lambda: calls.held() != [], "the call to hang for a second")
        calls.stop_waiting()
        wait_for(lambda: not waiting.is_alive(), "the waiting caller to be let go")
        (error,) = failed
        assert isinstance(error, NvmlShuttingDown)
        assert classify(error) is NvmlErrorKind.SHUTTING_DOWN
        assert "nvmlDeviceGetMemoryInfo on GPU 3 not waited for" in str(error)
        with pytest.raises(NvmlShuttingDown):  # a later call, on a lane that is not hung, is not made
            session.nv.nvmlDeviceGetName(session.nv.nvmlDeviceGetHandleByIndex(0))
        closed = threading.Thread(target=calls.shutdown, daemon=True)
        closed.start()
        wait_for(lambda: not closed.is_alive(), "shutdown not to wait on the hung call")
        (line,) = _lines(caplog, "NVML not shut down")
        assert "GPU 3 is stuck in nvmlDeviceGetMemoryInfo" in line, line
    finally:
        simulator.close()
        calls.close()


def test_the_deadline_flag_takes_seconds_within_bounds_from_the_command_line_or_the_environment() -> None:
    assert nvml_call_deadline("2.5") == 2.5
    for bad in ("abc", "0", "0.5", "601", "inf", "nan", ""):
        with pytest.raises(argparse.ArgumentTypeError, match=r"from 1 to 600 \(also as env "):
            nvml_call_deadline(bad)
    assert build_parser({}).parse_args(["run"]).nvml_call_deadline == 10.0
    from_env = build_parser({"NVDP_NVML_CALL_DEADLINE": "30"}).parse_args(["run"])
    assert from_env.nvml_call_deadline == 30.0
    given = build_parser({"NVDP_NVML_CALL_DEADLINE": "30"}).parse_args(["run", "--nvml-call-deadline", "4"])
    assert given.nvml_call_deadline == 4.0

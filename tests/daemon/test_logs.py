"""Log formats: readable lines by default, one JSON object per line with --log-format json."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import pytest

from nvidia_device_plugin.base.logs import RateLimitedLog, configure_logging

from support.health_support import FakeClock
from support.waiting import eventually


@pytest.fixture(autouse=True)
def restore_root_logger() -> object:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield None
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_for_log_pipelines(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", "json")
    logging.getLogger("nvidia_device_plugin.plugin.manager").info(
        "registered %s with kubelet", "nvidia.com/gpu"
    )
    logging.getLogger("nvidia_device_plugin.daemons.run").debug("not shown at info")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("nvidia_device_plugin.daemons.run").exception("reload failed")
    lines = capsys.readouterr().err.strip().splitlines()
    entries = [json.loads(line) for line in lines]
    assert len(entries) == 2
    assert entries[0]["msg"] == "registered nvidia.com/gpu with kubelet"
    assert entries[0]["level"] == "info"
    assert entries[0]["logger"] == "nvidia_device_plugin.plugin.manager"
    assert entries[0]["ts"].endswith("Z")
    assert entries[1]["level"] == "error" and "RuntimeError: boom" in entries[1]["error"]


def test_text_lines_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("warning", "text")
    logging.getLogger("nvidia_device_plugin.health").warning("GPU 3 is unhealthy: XID 79")
    logging.getLogger("nvidia_device_plugin.health").info("hidden at warning")
    err = capsys.readouterr().err
    assert "WARNING" in err and "nvidia_device_plugin.health: GPU 3 is unhealthy: XID 79" in err
    assert "hidden" not in err
    with pytest.raises(json.JSONDecodeError):
        json.loads(err.strip())


FORGED = "GPU-1\n2024-01-01 00:00:00,000 ERROR   nvidia_device_plugin.daemons.run: forged\r\x1b[31m\u2028end"


def test_text_format_escapes_control_characters_in_untrusted_strings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("info", "text")
    logging.getLogger("nvidia_device_plugin.plugin.server").warning("unknown device ID %s", FORGED)
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one record, one line
    assert "\u2028" not in err and "\r" not in err and "\x1b" not in err
    assert "GPU-1\\n2024-01-01" in err and "forged\\r\\x1b[31m\\u2028end" in err


def test_text_format_indents_tracebacks_so_no_line_can_pass_for_a_record(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("info", "text")
    try:
        raise ValueError(FORGED)
    except ValueError:
        logging.getLogger("nvidia_device_plugin.daemons.run").exception("reload failed")
    lines = capsys.readouterr().err.splitlines()
    assert "reload failed" in lines[0]
    assert len(lines) > 2 and all(line.startswith("    ") for line in lines[1:]), lines
    assert "ValueError: GPU-1" in lines[-2] and "forged\\r\\x1b[31m\\u2028end" in lines[-1]


def test_json_format_keeps_each_record_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", "json")
    logging.getLogger("nvidia_device_plugin.plugin.server").warning("unknown device ID %s", FORGED)
    try:
        raise ValueError(FORGED)
    except ValueError:
        logging.getLogger("nvidia_device_plugin.daemons.run").exception("failed on %s", FORGED)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    entries = [json.loads(line) for line in lines]
    assert entries[0]["msg"] == f"unknown device ID {FORGED}"  # the value survives, escaped only on the wire
    assert FORGED in entries[1]["error"]


# ---- RateLimitedLog (issue 23 item 15: a flapping GPU wrote ~20,000 lines in 10 s) -----------------------


def _rate_limited(
    caplog: pytest.LogCaptureFixture, burst: int, window_s: float, clock: Callable[[], float] = time.monotonic
) -> RateLimitedLog:
    logger = logging.getLogger("nvidia_device_plugin.test.ratelimit")
    caplog.set_level(logging.INFO, logger=logger.name)
    return RateLimitedLog(logger, burst=burst, window_s=window_s, clock=clock)


def _summaries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]


def test_repeated_lines_are_limited_per_key_and_summarised_when_the_window_ends(
    caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> None:
    clock = FakeClock()  # a busy machine's pause must not end the window between two lines
    lines = _rate_limited(caplog, burst=3, window_s=0.2, clock=clock)
    lines.start()  # the summaries' worker, as the daemon that owns the log starts it
    request.addfinalizer(lines.stop)
    logged = [lines.log("GPU-a", logging.WARNING, "GPU-a flip %d", n) for n in range(100)]
    assert lines.log("GPU-b", logging.INFO, "GPU-b once")  # another key has its own budget
    assert logged == [True] * 3 + [False] * 97
    assert _summaries(caplog) == []  # not before the window ends
    clock.advance(0.2)
    lines.wake()
    assert eventually(lambda: any("left out" in r.getMessage() for r in caplog.records))
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:3] == ["GPU-a flip 0", "GPU-a flip 1", "GPU-a flip 2"]
    assert "GPU-b once" in messages
    (summary,) = [m for m in messages if "left out" in m]
    assert summary == "97 more line(s) about GPU-a left out in 0.2s; the last: GPU-a flip 99"
    assert lines.log("GPU-a", logging.WARNING, "GPU-a after the window")  # a new window, a new budget


def test_the_summaries_are_a_worker_whose_stop_writes_what_is_pending_and_joins(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lines = _rate_limited(caplog, burst=1, window_s=3600.0)
    lines.start()
    assert lines.log("GPU-a", logging.WARNING, "GPU-a flip 0")
    assert not lines.alive  # no thread while no line is left out
    assert [lines.log("GPU-a", logging.WARNING, "GPU-a flip %d", n) for n in (1, 2)] == [False, False]
    assert lines.alive  # made for the first line left out
    lines.stop()
    assert not lines.alive  # joined by its owner's stop, not left to the end of the process
    assert _summaries(caplog) == ["2 more line(s) about GPU-a left out in 3600s; the last: GPU-a flip 2"]


def test_a_line_left_out_before_the_start_has_its_thread_made_by_the_start(
    caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> None:
    clock = FakeClock()
    lines = _rate_limited(caplog, burst=1, window_s=0.05, clock=clock)
    request.addfinalizer(lines.stop)
    assert [lines.log("GPU-a", logging.WARNING, "GPU-a flip %d", n) for n in range(2)] == [True, False]
    assert not lines.alive
    lines.start()
    assert lines.alive
    clock.advance(0.05)
    lines.wake()
    assert eventually(lambda: _summaries(caplog) != [])
    assert _summaries(caplog) == ["1 more line(s) about GPU-a left out in 0.05s; the last: GPU-a flip 1"]

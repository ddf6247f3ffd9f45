"""The one thread shape (workers.Worker, WorkerGroup) and the one "log once per reason" (logs.FailureLog)."""

from __future__ import annotations

import logging
import threading

import pytest

from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.base.workers import Worker, WorkerGroup

from support.threads import threads_named
from support.waiting import scaled, wait_for


class Recording(Worker):
    """A worker that waits for its stop event and records what happened to it, in order."""

    def __init__(self, name: str, journal: list[str]) -> None:
        super().__init__(name)
        self.journal = journal

    def setup(self) -> bool:
        self.journal.append(f"setup {self.name}")
        return True

    def run(self, stop: threading.Event) -> None:
        stop.wait()

    def cleanup(self) -> None:
        self.journal.append(f"cleanup {self.name}")


def test_a_worker_runs_on_its_named_thread_and_stop_joins_it() -> None:
    journal: list[str] = []
    worker = Recording("test-worker", journal)
    worker.start()
    assert worker.started and worker.alive
    assert len(threads_named("test-worker")) == 1
    worker.stop()
    assert not worker.alive and threads_named("test-worker") == []
    assert journal == ["setup test-worker", "cleanup test-worker"]
    assert worker.failure is None


def test_a_second_start_raises_while_running_after_the_end_and_after_stop() -> None:
    worker = Recording("twice", [])
    worker.start()
    with pytest.raises(RuntimeError, match="worker twice was already started"):
        worker.start()
    worker.stop()
    with pytest.raises(RuntimeError, match="already started"):
        worker.start()
    stopped_first = Recording("stopped-first", [])
    stopped_first.stop()
    with pytest.raises(RuntimeError, match="worker stopped-first was already stopped"):
        stopped_first.start()
    assert threads_named("stopped-first") == []


def test_stop_before_start_and_twice_is_fine_and_cleans_up_once() -> None:
    journal: list[str] = []
    worker = Recording("never-started", journal)
    worker.stop()
    worker.stop()
    assert journal == ["cleanup never-started"]
    assert not worker.started and worker.stopping.is_set()


def test_stop_from_the_workers_own_thread_does_not_join_itself() -> None:
    ended = threading.Event()

    def body(stop: threading.Event) -> None:
        holder[0].stop()  # e.g. a call back that stops its own watcher
        assert stop.is_set()
        ended.set()

    holder = [Worker("self-stopping", body)]
    holder[0].start()
    assert ended.wait(scaled(10))
    wait_for(lambda: not holder[0].alive, "the thread to end")
    assert holder[0].failure is None


def test_a_run_that_raises_is_logged_with_its_name_and_kept_as_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(stop: threading.Event) -> None:
        raise ValueError("a bug")

    group = WorkerGroup()
    worker = Worker("broken-worker", broken)
    group.add(worker)
    with caplog.at_level(logging.ERROR, logger="nvidia_device_plugin.base.workers"):
        group.start_all()
        wait_for(lambda: worker.failure is not None, "the failure")
    assert worker.failure == "ValueError: a bug"
    assert group.failures() == {"broken-worker": "ValueError: a bug"}
    (record,) = [r for r in caplog.records if "broken-worker" in r.getMessage()]
    assert record.getMessage() == "thread broken-worker ended with an unexpected error"
    assert record.exc_info is not None and "a bug" in str(record.exc_info[1])
    group.stop_all()


def test_a_run_that_returns_before_stop_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    worker = Worker("quitter", lambda stop: None)
    with caplog.at_level(logging.WARNING, logger="nvidia_device_plugin.base.workers"):
        worker.start()
        wait_for(lambda: not worker.alive, "the thread to end")
    assert "thread quitter ended before it was asked to stop" in caplog.text
    assert worker.failure is None
    worker.stop()


def test_a_setup_that_raises_fails_the_start_and_makes_no_thread() -> None:
    class Unbindable(Worker):
        def setup(self) -> bool:
            raise OSError("address in use")

    worker = Unbindable("unbindable")
    with pytest.raises(OSError, match="address in use"):
        worker.start()
    assert threads_named("unbindable") == []
    with pytest.raises(RuntimeError, match="already started"):
        worker.start()
    worker.stop()


def test_a_setup_with_nothing_to_run_makes_no_thread() -> None:
    class Idle(Worker):
        def setup(self) -> bool:
            return False

    worker = Idle("idle-worker")
    worker.start()
    assert worker.started and not worker.alive and threads_named("idle-worker") == []
    worker.stop()


def test_a_thread_put_off_is_made_once_by_start_thread_and_never_after_stop() -> None:
    class PutOff(Recording):
        def setup(self) -> bool:
            super().setup()
            return False  # no work yet

    journal: list[str] = []
    early = PutOff("put-off-early", journal)
    early.start_thread()  # not started: nothing
    assert threads_named("put-off-early") == []
    early.stop()
    worker = PutOff("put-off", journal)
    worker.start()
    assert worker.started and not worker.alive and threads_named("put-off") == []
    worker.start_thread()
    worker.start_thread()  # made already: still one thread
    assert worker.alive and len(threads_named("put-off")) == 1
    worker.stop()
    assert not worker.alive and threads_named("put-off") == []
    worker.start_thread()  # stopped: nothing
    assert not worker.alive and threads_named("put-off") == []
    stopped = PutOff("put-off-stopped", journal)
    stopped.start()
    stopped.stop()
    stopped.start_thread()
    assert threads_named("put-off-stopped") == []
    assert journal == [
        "cleanup put-off-early",
        "setup put-off",
        "cleanup put-off",
        "setup put-off-stopped",
        "cleanup put-off-stopped",
    ]


def test_a_thread_that_does_not_stop_in_time_is_left_behind_and_said_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    worker = Worker("stuck", lambda stop: release.wait())  # ignores its stop event
    worker.start()
    with caplog.at_level(logging.WARNING, logger="nvidia_device_plugin.base.workers"):
        worker.stop(timeout=0.01)
    assert "thread stuck did not stop within 0.01s; left behind" in caplog.text
    release.set()
    wait_for(lambda: not worker.alive, "the thread to end")


def test_a_group_starts_in_order_stops_in_reverse_and_replaces_in_place() -> None:
    journal: list[str] = []
    group = WorkerGroup()
    first, second, third = (Recording(n, journal) for n in ("first", "second", "third"))
    for worker in (first, second, third):
        group.add(worker)
    group.start_all()
    group.start_all()  # started members are not started again
    newer = Recording("second-again", journal)
    group.replace(second, newer)
    assert list(group) == [first, newer, third]
    group.stop_all()
    assert journal == [
        "setup first",
        "setup second",
        "setup third",
        "cleanup second",
        "setup second-again",
        "cleanup third",
        "cleanup second-again",
        "cleanup first",
    ]
    for name in ("first", "second", "third", "second-again"):
        assert threads_named(name) == []


def test_a_closed_group_starts_nothing_new_and_a_failing_stop_does_not_stop_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal: list[str] = []

    class FailingStop:
        def start(self) -> None:
            journal.append("start failing")

        def stop(self) -> None:
            raise RuntimeError("stop broke")

    group = WorkerGroup()
    kept = Recording("kept", journal)
    group.add(kept)
    group.add(FailingStop())
    group.start_all()
    with caplog.at_level(logging.ERROR, logger="nvidia_device_plugin.base.workers"):
        group.stop_all()
    assert "stopping FailingStop failed" in caplog.text
    late = Recording("late", journal)
    group.start(late)  # a reload racing the shutdown: not started
    assert not late.started and threads_named("late") == []
    assert journal == ["setup kept", "start failing", "cleanup kept"]


def test_failure_log_logs_each_reason_once_and_clears(caplog: pytest.LogCaptureFixture) -> None:
    failures = FailureLog(logging.getLogger("test.failures"))
    with caplog.at_level(logging.INFO, logger="test.failures"):
        assert failures.report("a", "a failed: one")
        assert not failures.report("a", "a failed: one")
        assert failures.report("a", "a failed: two")
        assert failures.report("b", "b failed", logging.ERROR)
        try:
            raise KeyError("x")
        except KeyError:
            assert failures.report("c", "c failed", exc_info=True)
    assert [r.getMessage() for r in caplog.records] == [
        "a failed: one",
        "a failed: two",
        "b failed",
        "c failed",
    ]
    assert caplog.records[2].levelno == logging.ERROR
    assert caplog.records[2].exc_info is None  # as a plain log call leaves it
    assert caplog.records[3].exc_info is not None
    assert len(failures) == 3 and failures.reason("a") == "a failed: two"
    assert not failures.report_first("a", "a failed: three")  # a's failure is outstanding
    assert failures.clear("a") and not failures.clear("a")
    assert failures.clear_all() and not failures.clear_all()
    assert len(failures) == 0 and failures.reason("b") is None
    with caplog.at_level(logging.INFO, logger="test.failures"):
        assert failures.report_first("gpu", "GPU 0 failed")
        assert not failures.report_first("gpu", "GPU 1 failed")  # the first line speaks for both
    assert caplog.records[-1].getMessage() == "GPU 0 failed"

"""Long-lived threads in one shape: a name, a stop event, one start, one stop that joins.

Every thread the daemons keep (registrar, config watch, health monitor, MPS readiness, labels writer,
probes, node-label watch, reload retry, MPS supervisor, the simulated events feeder) is a `Worker`. The
shape is the same for all of them, so a reader checks it once:

* `start()` runs `setup()` in the caller's thread (what must be in place when start returns: a bound
  port, a registered event set; raising there fails the start, returning False means nothing to run
  yet, and either way no thread is made), then `run(stop)` on a new thread named after the worker. A
  worker whose work only comes now and then (a summary to write, a retry to make) puts its thread off
  that way and makes it with `start_thread()` when the first piece arrives: most daemons never need
  those threads. A second start is a programming error and raises, whether the first run is still going,
  has ended, or the worker was stopped first: a worker is not restartable (make a new one).
* `stop()` sets the stop event, calls `wake()` (a worker blocked in a wait that the event cannot end
  overrides it), joins for at most `join_timeout_s`, then calls `cleanup()` once. It may be called
  before start, twice, or from the worker's own thread (then it does not join itself).
* A `run` that raises is logged once, with its traceback, under the worker's name, and kept as `failure`
  so a probe can report it; a `run` that returns before stop was asked for is logged too: no thread dies
  quietly.

`WorkerGroup` is the one list of what a daemon owns: started in order, stopped in reverse order (kopf's
spawn_tasks is the model), so a daemon's start and stop read as one line each. Besides Workers it holds
anything started and stopped the same way (`Lifecycle`: the plugin manager, which owns the registrar and
the gRPC servers). `wait_under` is the one wait on a condition that also polls (the kubelet stand-ins).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

# How long stop() waits for a thread to end. Workers wake promptly on their stop event; a thread stuck
# past this (an uninterruptible call) is left behind, daemonic, rather than hanging shutdown.
JOIN_TIMEOUT_S = 10.0


class Worker:
    """One long-lived thread. Subclass and override `run`, or pass `target` (called with the stop event)
    and, when the target blocks in a wait the stop event cannot end, `interrupt` (called by `wake`)."""

    join_timeout_s = JOIN_TIMEOUT_S

    def __init__(
        self,
        name: str,
        target: Callable[[threading.Event], None] | None = None,
        interrupt: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self._target = target
        self._interrupt = interrupt
        self._stop_event = threading.Event()
        self._lifecycle = threading.Lock()  # start() against stop(): a thread is joined only once started
        self._started = False
        self._cleaned_up = False
        self._thread: threading.Thread | None = None
        self._failure: str | None = None

    # ---- what a worker does (override) ----------------------------------------------------------------

    def setup(self) -> bool:
        """Runs in start()'s caller before the thread; raise to fail the start, return False when there is
        nothing to run yet (then no thread is made, unless `start_thread` makes it later). Default: nothing
        to prepare."""
        return True

    def run(self, stop: threading.Event) -> None:
        """The thread's body; return when `stop` is set. The default calls `target`."""
        if self._target is None:
            raise NotImplementedError(f"worker {self.name} has neither a run() nor a target")
        self._target(stop)

    def wake(self) -> None:
        """Interrupt a wait that the stop event alone does not end (a socket, an NVML event set)."""
        if self._interrupt is not None:
            self._interrupt()

    def cleanup(self) -> None:
        """Runs once in stop(), after the join (also for a worker never started). Default: nothing."""

    # ---- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        with self._lifecycle:
            if self._started:
                raise RuntimeError(f"worker {self.name} was already started; a worker runs once")
            if self._stop_event.is_set():
                raise RuntimeError(f"worker {self.name} was already stopped; a worker runs once")
            self._started = True
            if not self.setup():
                return
            self._spawn()

    def start_thread(self) -> None:
        """Make the thread that setup() put off (it returned False), now that there is work for it. Nothing
        when the thread was made already, or the worker is not started or is stopping."""
        with self._lifecycle:
            if self._started and self._thread is None and not self._stop_event.is_set():
                self._spawn()

    def _spawn(self) -> None:  # the lifecycle lock held
        self._thread = threading.Thread(target=self._body, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stop_event.set()
        self.wake()
        with self._lifecycle:
            thread = self._thread
            clean, self._cleaned_up = not self._cleaned_up, True
        if thread is not None and thread is not threading.current_thread():
            limit = self.join_timeout_s if timeout is None else timeout
            thread.join(limit)
            if thread.is_alive():
                log.warning("thread %s did not stop within %gs; left behind", self.name, limit)
        if clean:
            self.cleanup()

    @property
    def stopping(self) -> threading.Event:
        """Set once stop() was called: what `run` loops on and waits on."""
        return self._stop_event

    @property
    def started(self) -> bool:
        return self._started

    @property
    def alive(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def failure(self) -> str | None:
        """Why `run` ended with an exception; None while it runs or after a clean end."""
        return self._failure

    def _body(self) -> None:
        try:
            self.run(self._stop_event)
        except BaseException as exc:  # the one place a worker's unexpected end is reported (SystemExit too)
            log.exception("thread %s ended with an unexpected error", self.name)
            self._failure = f"{type(exc).__name__}: {exc}"  # after the line: whoever sees it can read why
            return
        if not self._stop_event.is_set():
            log.warning("thread %s ended before it was asked to stop", self.name)


class Lifecycle(Protocol):
    """What a WorkerGroup runs: a Worker, or an owner of threads started and stopped the same way."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass
class _Member:
    """A part of the group, and whether the group started it already (each part is started once)."""

    part: Lifecycle
    started: bool = False


class WorkerGroup:
    """What one daemon owns: started in the order added, stopped in reverse order.

    Once `stop_all` began, the group is closed: a member added or replaced after that (a reload racing
    the shutdown) is not started, and is stopped with the rest, so nothing outlives the daemon's stop.
    """

    def __init__(self) -> None:
        self._members: list[_Member] = []
        self._lock = threading.Lock()
        self._closed = False

    def add(self, part: Lifecycle) -> Lifecycle:
        with self._lock:
            self._members.append(_Member(part))
        return part

    def start(self, part: Lifecycle) -> None:
        """Add `part` and start it (for parts made after the daemon started, e.g. on a reload)."""
        self.add(part)
        self._start(part)

    def replace(self, old: Lifecycle | None, new: Lifecycle) -> None:
        """Stop `old` (when given) and start `new` in its place in the order; appended when `old` is None."""
        if old is not None:
            old.stop()
        with self._lock:
            at = next((i for i, m in enumerate(self._members) if m.part is old), None)
            if at is None:
                self._members.append(_Member(new))
            else:
                self._members[at] = _Member(new)
        self._start(new)

    def start_all(self) -> None:
        """Start every member not started yet, in order; the first that raises stops the start."""
        for part in self._parts():
            self._start(part)

    def stop_all(self) -> None:
        """Stop every member, last first (started or not); a stop that raises is logged, the rest go on."""
        with self._lock:
            self._closed = True
        stopped: list[Lifecycle] = []  # the parts themselves, not ids: a replaced part may be freed
        while remaining := [p for p in reversed(self._parts()) if not any(p is s for s in stopped)]:
            for part in remaining:
                stopped.append(part)
                try:
                    part.stop()
                except Exception:
                    log.exception("stopping %s failed", _name(part))

    def failures(self) -> dict[str, str]:
        """Workers whose run ended with an error, by name."""
        return {p.name: p.failure for p in self._parts() if isinstance(p, Worker) and p.failure is not None}

    def __iter__(self) -> Iterator[Lifecycle]:
        return iter(self._parts())

    def _parts(self) -> list[Lifecycle]:
        with self._lock:
            return [m.part for m in self._members]

    def _start(self, part: Lifecycle) -> None:
        with self._lock:
            member = next((m for m in self._members if m.part is part), None)
            if self._closed or member is None or member.started:
                return
            member.started = True
        part.start()


def _name(part: Lifecycle) -> str:
    return part.name if isinstance(part, Worker) else type(part).__name__


def wait_under(changed: threading.Condition, predicate: Callable[[], bool], timeout: float) -> bool:
    """Wait until predicate() holds, evaluated under `changed` at each notify and at least every 0.1 s
    (a predicate may read state that changes without a notify); False after `timeout`."""
    deadline = time.monotonic() + timeout
    with changed:
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            changed.wait(timeout=min(left, 0.1))
        return True

"""Long-lived threads in one shape: a name, a stop event, one start, one stop that joins.

Every thread the daemons keep (registrar, config watch, health monitor, readiness, labels writer, probes,
node-label watch, MPS supervisor, the simulated events feeder) is a `Worker`. The shape is the same for
all of them, so a reader checks it once:

* `start()` runs `run(stop)` on a new thread named after the worker. A second start is a programming
  error and raises, whether the first run is still going or has ended (a worker is not restartable: make
  a new one).
* `stop()` sets the stop event, calls `wake()` (a worker blocked in a wait that the event cannot end
  overrides it) and joins. It may be called before start, twice, or from the worker's own thread (then
  it does not join itself).
* A `run` that raises is logged once, with its traceback, under the worker's name, and kept as `failure`
  so a probe can report it: no thread dies quietly.

`WorkerGroup` is the one list of what a daemon owns: started in order, stopped in reverse order (kopf's
spawn_tasks is the model), so a daemon's start and stop read as one line each.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

# How long stop() waits for a thread to end. Workers wake promptly on their stop event; a thread stuck
# past this (an uninterruptible call) is left behind, daemonic, rather than hanging shutdown.
JOIN_TIMEOUT_S = 10.0


class Worker:
    """One long-lived thread. Subclass and override `run`, or pass `target` (called with the stop event)."""

    def __init__(self, name: str, target: Callable[[threading.Event], None] | None = None) -> None:
        self.name = name
        self._target = target
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: str | None = None

    # ---- what a worker does ---------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """The thread's body; return when `stop` is set. The default calls `target`."""
        if self._target is None:
            raise NotImplementedError(f"worker {self.name} has neither a run() nor a target")
        self._target(stop)

    def wake(self) -> None:
        """Interrupt a wait that the stop event alone does not end (a socket, an NVML event set)."""

    # ---- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"worker {self.name} was already started; a worker runs once")
        self._thread = threading.Thread(target=self._body, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        self._stop_event.set()
        self.wake()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        thread.join(timeout)
        if thread.is_alive():
            log.warning("thread %s did not stop within %gs; left behind", self.name, timeout)

    @property
    def stopping(self) -> threading.Event:
        """Set once stop() was called: what `run` loops on and waits on."""
        return self._stop_event

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def failure(self) -> str | None:
        """Why `run` ended with an exception; None while it runs or after a clean end."""
        return self._failure

    def _body(self) -> None:
        try:
            self.run(self._stop_event)
        except Exception as exc:  # the one place a worker's unexpected error is reported
            self._failure = f"{type(exc).__name__}: {exc}"
            log.exception("thread %s ended with an unexpected error", self.name)


class WorkerGroup:
    """What one daemon owns: workers started in the order added, stopped in reverse order."""

    def __init__(self) -> None:
        self._workers: list[Worker] = []
        self._lock = threading.Lock()

    def add(self, worker: Worker) -> Worker:
        with self._lock:
            self._workers.append(worker)
        return worker

    def start(self, worker: Worker) -> Worker:
        """Add `worker` and start it (for workers made after the daemon started, e.g. on a reload)."""
        self.add(worker)
        worker.start()
        return worker

    def replace(self, old: Worker | None, new: Worker) -> Worker:
        """Stop and drop `old` (when given), then add and start `new`."""
        if old is not None:
            old.stop()
            with self._lock:
                self._workers = [w for w in self._workers if w is not old]
        return self.start(new)

    def start_all(self) -> None:
        for worker in list(self):
            if not worker.started:
                worker.start()

    def stop_all(self) -> None:
        for worker in reversed(list(self)):
            worker.stop()

    def failures(self) -> dict[str, str]:
        """Workers whose run ended with an error, by name."""
        return {w.name: w.failure for w in self if w.failure is not None}

    def __iter__(self) -> Iterator[Worker]:
        with self._lock:
            return iter(list(self._workers))

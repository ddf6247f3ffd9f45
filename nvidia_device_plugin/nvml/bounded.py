"""Every NVML call behind a deadline: one call that never returns (a driver in a GPU reset) costs its GPU,
never the node.

pynvml calls cannot be interrupted, so a call that hangs is abandoned, not cancelled. Each call runs on a
*lane*, a worker thread per GPU (plus one for the event set and one for the library's own calls), and its
caller waits at most the call's deadline (`call_timeout_s`, 10 s by default; an event wait adds its own
timeout, nvmlInit gets 60 s). A call past its deadline raises `NvmlCallStuck` (a pynvml.NVMLError, kind
STUCK in nvml/errors.py) and leaves its lane *stuck*: until the call returns, every other call on that lane
fails at once with NvmlCallStuck naming it, so nothing piles up behind it, while the other lanes (the
other GPUs, the event wait) go on. What callers do with STUCK: discovery serves the GPU as lost with what
it read (and a reload carries its earlier facts over, see snapshot.py), the health monitor marks it
unhealthy at once, naming the call.

A call is on GPU n when its first argument is GPU n's index (nvmlDeviceGetHandleByIndex), its UUID, or a
handle this wrapper handed out for it or for a MIG device on it; the wrapper learns those from the calls'
results. Each stuck call is logged when it gets stuck and when it returns, and reported to `subscribe`d
listeners (the daemon's metric `nvidia_device_plugin_nvml_stuck_calls{call}`).

A call that returns but took more than `slow_after_s` (a quarter of the deadline by default, plus what an
event wait or nvmlInit is allowed beyond it) is *slow*: a driver close to its deadline holds every reload
and health check of its GPU that long, so it is counted (`subscribe_slow`: the daemon's metric
`nvidia_device_plugin_nvml_slow_calls_total{call}`) and logged with its call and GPU, at most once a
minute per call and GPU (the lines left out are counted in the next).

Stopping never waits on a hung call: `stop_waiting()` (the daemon's first step of its stop) makes every
call in flight, and every later one, fail at once with NvmlShuttingDown, so no thread of the daemon waits
out a deadline on its way out; `shutdown()` then skips nvmlShutdown when a lane is stuck (the real driver
would make it wait on that call too), saying which call held it, and otherwise gives it SHUTDOWN_TIMEOUT_S.
"""

from __future__ import annotations

import _thread
import ctypes
import functools
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import pynvml

from nvidia_device_plugin.base.signals import HANDLED
from nvidia_device_plugin.base.workers import Worker
from nvidia_device_plugin.nvml.api import NvmlApi, api_functions
from nvidia_device_plugin.nvml.deadlines import DEFAULT_CALL_TIMEOUT_S, SLOW_FRACTION
from nvidia_device_plugin.nvml.errors import NVML_CALL_STUCK, NVML_SHUTTING_DOWN

log = logging.getLogger(__name__)

SLOW_LOG_INTERVAL_S = 60.0  # at most one slow-call line per call and device in this time
SHUTDOWN_TIMEOUT_S = 5.0  # the most nvmlShutdown may take when the process stops (kubelet gives 30 s)
INIT_TIMEOUT_S = 60.0  # nvmlInit loads the driver and may wake every GPU
_HELD_AFTER_S = 1.0  # a call running this long when the process stops is taken as hung (see held())
_LANE_LIMIT = 256  # lanes made for unknown devices beyond this share one
_SYSTEM: tuple[str, ...] = ("system",)
_EVENTS: tuple[str, ...] = ("events",)
_EVENT_CALLS = frozenset({"nvmlEventSetCreate", "nvmlEventSetWait_v2", "nvmlEventSetFree"})

EVENTS = "events"  # run_on's name of the event set's lane
T = TypeVar("T")
StuckListener = Callable[[str, bool], None]  # (call, stuck now): True when it got stuck, False on return
SlowListener = Callable[[str, str, float], None]  # (call, where, seconds it took): a slow call returned


class NvmlCallStuck(pynvml.NVMLError):  # type: ignore[misc]  # pynvml is untyped
    """A call that did not return within its deadline, or was not tried because its lane is stuck."""

    def __new__(cls, call: str, where: str, message: str) -> NvmlCallStuck:
        obj: NvmlCallStuck = Exception.__new__(cls)
        obj.value = NVML_CALL_STUCK
        return obj

    def __init__(self, call: str, where: str, message: str) -> None:
        super().__init__(NVML_CALL_STUCK)
        self.call = call  # the call that is stuck (not always the one refused)
        self.where = where
        self.message = message

    def __str__(self) -> str:
        return self.message


class NvmlShuttingDown(pynvml.NVMLError):  # type: ignore[misc]  # pynvml is untyped
    """A call not waited for because the process is stopping (BoundedNvml.stop_waiting); kind SHUTTING_DOWN
    in nvml/errors.py."""

    def __new__(cls, call: str, where: str) -> NvmlShuttingDown:
        obj: NvmlShuttingDown = Exception.__new__(cls)
        obj.value = NVML_SHUTTING_DOWN
        return obj

    def __init__(self, call: str, where: str) -> None:
        super().__init__(NVML_SHUTTING_DOWN)
        self.call = call
        self.where = where

    def __str__(self) -> str:
        return f"NVML is shutting down: {self.call} on {self.where} not waited for"


class _Call:
    """One call handed to a lane. `done` is held from submission until the lane has run it: a raw lock,
    as this hand-over is on every NVML call (an Event costs several times as much)."""

    __slots__ = (
        "abandoned",
        "args",
        "cancelled",
        "done",
        "error",
        "finished",
        "fn",
        "kwargs",
        "name",
        "result",
        "slow_after_s",
        "started_at",
        "stuck",
        "stuck_in",
    )

    def __init__(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        slow_after_s: float | None = None,
    ) -> None:
        self.name = name
        self.slow_after_s = slow_after_s  # None: a job, whose NVML calls are timed one by one
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.done = _thread.allocate_lock()
        self.done.acquire()
        self.result: Any = None
        self.error: BaseException | None = None
        self.started_at: float | None = None
        self.finished = False
        self.stuck = False  # its caller gave up on it while it ran
        self.stuck_in: str | None = None  # the NVML call it was in then
        self.cancelled = False  # its caller gave up on it before it started: never run
        self.abandoned = False  # its caller was let go by stop_waiting: `done` was released then


class _Lane(Worker):
    """One thread running the NVML calls of one GPU (or the event set, or the library), one at a time."""

    join_timeout_s = 1.0  # a lane stuck in a call is left behind (daemonic) when the session closes

    def __init__(self, name: str, where: str, owner: BoundedNvml) -> None:
        super().__init__(name)
        self.where = where
        self._on_stuck = owner._stuck
        self._on_slow = owner._slow
        self._timeout_s = owner.call_timeout_s
        self._slow_after_s = owner.slow_after_s
        self._state = threading.Lock()  # guards _running, _waiting and the calls' started/finished flags
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()  # None: stop
        self._running: _Call | None = None
        self._waiting: set[_Call] = set()  # calls whose callers wait on them (let go by abandon)
        self._abandoned = False
        self._in_call: str | None = None  # the NVML call a job runs right now (named when it is stuck)

    def inline(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call of a job running on this lane: made here, named while it runs, and timed."""
        outer, self._in_call = self._in_call, name
        started = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            self._in_call = outer
            took = time.monotonic() - started
            job = self._running  # a stuck or abandoned job is reported as such when it returns
            # The allowance is never negative: a call under the plain bound is fast without looking it up
            # (nearly every call: this runs after each one of a job's calls).
            if (
                took > self._slow_after_s
                and took > self._slow_after_s + _allowance_s(name, args, self._timeout_s)
                and not (job is not None and (job.stuck or job.abandoned))
            ):
                self._on_slow(name, self.where, took)

    def call(self, item: _Call, timeout_s: float, shutting_down: bool = False) -> Any:
        """`item` run on this lane, waited for at most `timeout_s`; `shutting_down`: even once abandoned."""
        with self._state:
            if self._abandoned and not shutting_down:
                raise NvmlShuttingDown(item.name, self.where)
            running = self._running
            if running is not None and running.stuck:
                raise self._refused(item.name, running)
            self._waiting.add(item)
        self._queue.put(item)
        if not item.done.acquire(timeout=timeout_s):
            refusal = self._give_up(item, timeout_s)
            if refusal is not None:
                raise refusal
        if item.abandoned:
            raise NvmlShuttingDown(item.name, self.where)
        if item.error is not None:
            raise item.error
        return item.result

    def abandon(self) -> None:
        """Let every caller waiting on this lane go (NvmlShuttingDown), and refuse every later call."""
        with self._state:
            self._abandoned = True
            waiting, self._waiting = self._waiting, set()
            for item in waiting:
                item.abandoned = True
                item.done.release()

    def held_by(self) -> str | None:
        """'GPU 3 is stuck in nvmlDeviceGetMemoryInfo (for 14s)' while a call is stuck here, or has run for
        _HELD_AFTER_S (a call takes milliseconds: this one is likely hung, not yet past its deadline)."""
        with self._state:
            running = self._running
            if running is None or running.started_at is None:
                return None
            since = time.monotonic() - running.started_at
            if not running.stuck and since < _HELD_AFTER_S:
                return None
            call = running.stuck_in or self._in_call or running.name
        return f"{self.where} is stuck in {call} (for {since:.0f}s)"

    def _give_up(self, item: _Call, timeout_s: float) -> NvmlCallStuck | None:
        """Why `item` failed its deadline (the lane is then stuck in it); None when it just returned."""
        with self._state:
            if item.finished or item.abandoned:
                return None
            self._waiting.discard(item)
            if item.started_at is None:  # never started: behind a call that got stuck meanwhile
                item.cancelled = True
                running = self._running
                return (
                    self._refused(item.name, running) if running is not None else self._late(item, timeout_s)
                )
            item.stuck = True
            item.stuck_in = self._in_call or item.name  # a job is named by the NVML call it is in
        log.warning(
            "NVML call %s on %s has not returned within %gs (stuck in the NVIDIA driver, %s); %s is "
            "served as unusable and its calls fail at once until it returns",
            item.stuck_in,
            self.where,
            timeout_s,
            item.name,
            self.where,
        )
        self._on_stuck(item.stuck_in, True)
        return self._late(item, timeout_s)

    def _late(self, item: _Call, timeout_s: float) -> NvmlCallStuck:
        call = item.stuck_in or item.name
        message = f"{call} on {self.where} did not return within {timeout_s:g}s (stuck in the driver)"
        return NvmlCallStuck(call, self.where, message)

    def _refused(self, name: str, running: _Call) -> NvmlCallStuck:
        since = time.monotonic() - (running.started_at or time.monotonic())
        call = running.stuck_in or running.name
        message = f"{self.where} is stuck in {call} (for {since:.0f}s); {name} not tried"
        return NvmlCallStuck(call, self.where, message)

    def wake(self) -> None:
        self._queue.put(None)

    def run(self, stop: threading.Event) -> None:
        # A lane may start before the daemon blocks its signals (the CLI opens a simulated session
        # first): it must never be the thread SIGTERM lands on, as no one there would take it.
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        _on_lane.lane = self
        while (item := self._queue.get()) is not None:
            with self._state:
                if item.cancelled or item.abandoned:
                    continue
                self._running = item
                item.started_at = time.monotonic()
            try:
                item.result = item.fn(*item.args, **item.kwargs)
            except BaseException as exc:  # handed to the caller, who raises it (or gave up long ago)
                item.error = exc
            took = time.monotonic() - item.started_at
            if (
                item.slow_after_s is not None
                and took > item.slow_after_s
                and not (item.stuck or item.abandoned)
            ):
                self._on_slow(item.name, self.where, took)  # counted by the time its caller has the answer
            with self._state:
                self._running = None
                item.finished = True
                if not item.abandoned:  # stop_waiting released it already
                    self._waiting.discard(item)
                    item.done.release()
            if item.stuck:
                call = item.stuck_in or item.name
                log.warning(
                    "NVML call %s on %s returned after %.1fs; its calls go on", call, self.where, took
                )
                self._on_stuck(call, False)


class BoundedNvml:
    """An NvmlApi whose every call has a deadline (see the module doc); other attributes are the inner
    API's (the simulator's controls, interrupt_event_wait)."""

    def __init__(
        self,
        inner: NvmlApi,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        slow_after_s: float | None = None,
    ) -> None:
        self._inner = inner
        self._timeout_s = call_timeout_s
        # A call is slow past this (plus what an event wait or nvmlInit is allowed beyond its deadline).
        self._slow_after_s = call_timeout_s * SLOW_FRACTION if slow_after_s is None else slow_after_s
        self._lock = threading.Lock()
        self._lanes: dict[Hashable, _Lane] = {}
        self._lane_of_handle: dict[int, Hashable] = {}  # address of a handle we handed out -> its lane
        self._lane_of_uuid: dict[str, Hashable] = {}
        self._listeners: list[StuckListener] = []
        self._slow_listeners: list[SlowListener] = []
        self._slow_lines = _SlowCallLog()
        self._closed = False
        self._abandoned = False

    @property
    def call_timeout_s(self) -> float:
        return self._timeout_s

    @property
    def slow_after_s(self) -> float:
        return self._slow_after_s

    def subscribe(self, listener: StuckListener) -> Callable[[], None]:
        """Call `listener(call, stuck)` whenever a call gets stuck (True) or a stuck one returns (False);
        returns what ends that."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def subscribe_slow(self, listener: SlowListener) -> None:
        """Call `listener(call, where, seconds)` whenever a slow call returns (see the module doc)."""
        with self._lock:
            self._slow_listeners.append(listener)

    def stop_waiting(self) -> None:
        """From now on no caller waits on NVML: calls in flight and every later one fail at once with
        NvmlShuttingDown (the process is stopping; its threads must not wait out a deadline on the way)."""
        with self._lock:
            self._abandoned = True
            lanes = list(self._lanes.values())
        for lane in lanes:
            lane.abandon()

    def held(self) -> list[str]:
        """What holds NVML now, one line a lane stuck in a call or in one for _HELD_AFTER_S: 'GPU 3 is stuck
        in nvmlDeviceGetMemoryInfo (for 14s)'."""
        with self._lock:
            lanes = list(self._lanes.values())
        return [held for lane in lanes if (held := lane.held_by()) is not None]

    def shutdown(self) -> None:
        """nvmlShutdown within SHUTDOWN_TIMEOUT_S, unless a call is stuck: the driver would make it wait on
        that call (and the process with it), so it is skipped, naming the call. Failures are logged."""
        if held := self.held():
            log.warning(
                "NVML not shut down: %s; the process stops without waiting for the driver", "; ".join(held)
            )
            return
        item = _Call("nvmlShutdown", self._inner.nvmlShutdown, (), {}, None)
        try:
            self._lane(_SYSTEM).call(item, min(self._timeout_s, SHUTDOWN_TIMEOUT_S), shutting_down=True)
        except pynvml.NVMLError as exc:
            log.warning("NVML shutdown failed: %s", exc)

    def close(self) -> None:
        """Stop the lanes; one stuck in a call is left behind at once, until that call returns."""
        with self._lock:
            self._closed = True
            lanes = list(self._lanes.values())
        for lane in lanes:
            lane.stop(timeout=0.0 if lane.held_by() is not None else None)

    def __getattr__(self, name: str) -> Any:
        if name not in _API:
            return getattr(self._inner, name)
        bound = functools.partial(self._call, name)
        setattr(self, name, bound)  # found directly from now on
        return bound

    def run_on(self, device: int | str, what: str, job: Callable[[], T], extra_s: float = 0.0) -> T:
        """`job()` on the lane of `device` (a GPU index, a GPU or MIG UUID, or EVENTS) within the call
        deadline (plus `extra_s`); the NVML calls it makes run on that lane's thread, one after the other,
        without a hand-over each. Raises NvmlCallStuck naming the NVML call it is stuck in."""
        if getattr(_on_lane, "lane", None) is not None:
            return job()  # already on a lane (a job inside a job): no second hand-over
        with self._lock:
            if device == EVENTS:
                key: Hashable = _EVENTS
            elif isinstance(device, int):
                key = ("gpu", device)
            else:
                key = self._lane_of_uuid.get(device, ("device", device))
        result: T = self._lane(key).call(_Call(what, job, (), {}), self._timeout_s + extra_s)
        return result

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self._inner, name)
        lane: _Lane | None = getattr(_on_lane, "lane", None)
        if lane is not None:  # inside a job: run here, on the job's lane, naming the call while it runs
            result = lane.inline(name, fn, args, kwargs)
            self._learn(name, args, result)
            return result
        key = self._lane_key(name, args)
        slow_after_s = self._slow_after_s + _allowance_s(name, args, self._timeout_s)
        item = _Call(name, fn, args, kwargs, slow_after_s)
        result = self._lane(key).call(item, self._deadline(name, args))
        self._learn(name, args, result, key)
        return result

    def _deadline(self, name: str, args: tuple[Any, ...]) -> float:
        return self._timeout_s + _allowance_s(name, args, self._timeout_s)

    def _lane_key(self, name: str, args: tuple[Any, ...]) -> Hashable:
        if name in _EVENT_CALLS:
            return _EVENTS
        first = args[0] if args else None
        with self._lock:
            if name == "nvmlDeviceGetHandleByIndex" and isinstance(first, int):
                return ("gpu", first)
            if isinstance(first, str | bytes):
                text = first.decode() if isinstance(first, bytes) else first
                return self._lane_of_uuid.get(text, ("device", text))
            address = _address(first)
            if address is not None:
                return self._lane_of_handle.get(address, ("device", address))
        return _SYSTEM

    def _learn(self, name: str, args: tuple[Any, ...], result: Any, key: Hashable | None = None) -> None:
        """Remember which lane the handles and UUIDs a call returned belong to: the lane of its arguments
        (`key`, worked out here when the call ran inline: only a result that teaches one needs it)."""
        if not _teaches(name, result):
            return
        if key is None:
            key = self._lane_key(name, args)
        if key in (_SYSTEM, _EVENTS):
            return
        address = _address(result)
        with self._lock:
            if address is not None:
                self._lane_of_handle[address] = key
            elif name == "nvmlDeviceGetUUID" and isinstance(result, str | bytes):
                text = result.decode() if isinstance(result, bytes) else result
                self._lane_of_uuid[text] = key

    def _lane(self, key: Hashable) -> _Lane:
        with self._lock:
            lane = self._lanes.get(key)
            if lane is None:
                if len(self._lanes) >= _LANE_LIMIT:
                    key = ("device", "other")
                    lane = self._lanes.get(key)
                if lane is None:
                    lane = _Lane(_lane_name(key), _lane_label(key), self)
                    self._lanes[key] = lane
                    if self._abandoned:
                        lane.abandon()
                    if not self._closed:
                        lane.start()
        return lane

    def _stuck(self, call: str, stuck: bool) -> None:
        with self._lock:
            listeners = tuple(self._listeners)
        for listener in listeners:
            try:
                listener(call, stuck)
            except Exception:
                log.exception("NVML stuck-call listener %r failed", listener)

    def _slow(self, call: str, where: str, took: float) -> None:
        self._slow_lines.report(call, where, took, self._timeout_s)
        with self._lock:
            listeners = tuple(self._slow_listeners)
        for listener in listeners:
            try:
                listener(call, where, took)
            except Exception:
                log.exception("NVML slow-call listener %r failed", listener)


class _SlowCallLog:
    """The slow-call lines: the first of each call and device at once, then at most one per
    SLOW_LOG_INTERVAL_S, counting those left out. At most one entry per pynvml function and lane."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # -> (last logged at, left out since)

    def report(self, call: str, where: str, took: float, deadline_s: float) -> None:
        now = time.monotonic()
        with self._lock:
            logged_at, left_out = self._last.get((call, where), (None, 0))
            if logged_at is not None and now - logged_at < SLOW_LOG_INTERVAL_S:
                self._last[(call, where)] = (logged_at, left_out + 1)
                return
            self._last[(call, where)] = (now, 0)
        more = f"; {left_out} more slow since the last line" if left_out else ""
        log.warning(
            "NVML call %s on %s was slow: it took %.1fs (deadline %gs); every reload and health check of %s "
            "waits that long%s",
            call,
            where,
            took,
            deadline_s,
            where,
            more,
        )


def _allowance_s(name: str, args: tuple[Any, ...], timeout_s: float) -> float:
    """What a call may take beyond the call deadline `timeout_s`: an event wait its own timeout, nvmlInit
    up to INIT_TIMEOUT_S in all (it loads the driver)."""
    if name == "nvmlInit":
        return max(INIT_TIMEOUT_S - timeout_s, 0.0)
    if name == "nvmlEventSetWait_v2" and len(args) > 1 and isinstance(args[1], int):
        return args[1] / 1000.0
    return 0.0


_API = frozenset(api_functions())
_on_lane = threading.local()  # .lane: the _Lane whose thread this is (its jobs' calls run inline)


def on_lane(nv: NvmlApi, device: int | str, what: str, job: Callable[[], T], extra_s: float = 0.0) -> T:
    """`job()`, which calls `nv`, on `device`'s lane when `nv` is bounded (BoundedNvml.run_on); called
    directly otherwise (a bare simulator or pynvml in tests and tools)."""
    if isinstance(nv, BoundedNvml):
        return nv.run_on(device, what, job, extra_s)
    return job()


def _teaches(name: str, result: object) -> bool:
    """Whether `result` tells which lane later calls belong on: a handle, or a device's UUID."""
    return isinstance(result, ctypes._Pointer) or (
        name == "nvmlDeviceGetUUID" and isinstance(result, str | bytes)
    )


def _address(value: object) -> int | None:
    """The address of a ctypes pointer (an NVML handle), None for anything else."""
    if not isinstance(value, ctypes._Pointer):
        return None
    return ctypes.cast(value, ctypes.c_void_p).value


def _lane_name(key: Hashable) -> str:
    if not isinstance(key, tuple):
        return "nvml-device"
    if key in (_SYSTEM, _EVENTS):
        return f"nvml-{key[0]}"
    if key[0] == "gpu":
        return f"nvml-gpu{key[1]}"
    return "nvml-device"


def _lane_label(key: Hashable) -> str:
    if key == _SYSTEM:
        return "NVML"
    if key == _EVENTS:
        return "the NVML event set"
    if isinstance(key, tuple) and key[0] == "gpu":
        return f"GPU {key[1]}"
    return f"device {key[1]}" if isinstance(key, tuple) else "a device"

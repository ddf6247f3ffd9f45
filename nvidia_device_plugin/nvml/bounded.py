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
from nvidia_device_plugin.nvml.errors import NVML_CALL_STUCK

log = logging.getLogger(__name__)

DEFAULT_CALL_TIMEOUT_S = 10.0
INIT_TIMEOUT_S = 60.0  # nvmlInit loads the driver and may wake every GPU
_LANE_LIMIT = 256  # lanes made for unknown devices beyond this share one
_SYSTEM: tuple[str, ...] = ("system",)
_EVENTS: tuple[str, ...] = ("events",)
_EVENT_CALLS = frozenset({"nvmlEventSetCreate", "nvmlEventSetWait_v2", "nvmlEventSetFree"})

EVENTS = "events"  # run_on's name of the event set's lane
T = TypeVar("T")
StuckListener = Callable[[str, bool], None]  # (call, stuck now): True when it got stuck, False on return


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


class _Call:
    """One call handed to a lane. `done` is held from submission until the lane has run it: a raw lock,
    as this hand-over is on every NVML call (an Event costs several times as much)."""

    __slots__ = (
        "args",
        "cancelled",
        "done",
        "error",
        "finished",
        "fn",
        "kwargs",
        "name",
        "result",
        "started_at",
        "stuck",
        "stuck_in",
    )

    def __init__(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.name = name
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


class _Lane(Worker):
    """One thread running the NVML calls of one GPU (or the event set, or the library), one at a time."""

    join_timeout_s = 1.0  # a lane stuck in a call is left behind (daemonic) when the session closes

    def __init__(self, name: str, where: str, on_stuck: StuckListener) -> None:
        super().__init__(name)
        self.where = where
        self._on_stuck = on_stuck
        self._state = threading.Lock()  # guards _running and the calls' started/finished flags
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()  # None: stop
        self._running: _Call | None = None
        self._in_call: str | None = None  # the NVML call a job runs right now (named when it is stuck)

    def inline(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call of a job running on this lane: made here, and named while it runs."""
        outer, self._in_call = self._in_call, name
        try:
            return fn(*args, **kwargs)
        finally:
            self._in_call = outer

    def call(self, item: _Call, timeout_s: float) -> Any:
        with self._state:
            running = self._running
            if running is not None and running.stuck:
                raise self._refused(item.name, running)
        self._queue.put(item)
        if not item.done.acquire(timeout=timeout_s):
            refusal = self._give_up(item, timeout_s)
            if refusal is not None:
                raise refusal
        if item.error is not None:
            raise item.error
        return item.result

    def _give_up(self, item: _Call, timeout_s: float) -> NvmlCallStuck | None:
        """Why `item` failed its deadline (the lane is then stuck in it); None when it just returned."""
        with self._state:
            if item.finished:
                return None
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
                if item.cancelled:
                    continue
                self._running = item
                item.started_at = time.monotonic()
            try:
                item.result = item.fn(*item.args, **item.kwargs)
            except BaseException as exc:  # handed to the caller, who raises it (or gave up long ago)
                item.error = exc
            with self._state:
                self._running = None
                item.finished = True
                item.done.release()
            if item.stuck:
                took = time.monotonic() - (item.started_at or 0.0)
                call = item.stuck_in or item.name
                log.warning(
                    "NVML call %s on %s returned after %.1fs; its calls go on", call, self.where, took
                )
                self._on_stuck(call, False)


class BoundedNvml:
    """An NvmlApi whose every call has a deadline (see the module doc); other attributes are the inner
    API's (the simulator's controls, interrupt_event_wait)."""

    def __init__(self, inner: NvmlApi, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> None:
        self._inner = inner
        self._timeout_s = call_timeout_s
        self._lock = threading.Lock()
        self._lanes: dict[Hashable, _Lane] = {}
        self._lane_of_handle: dict[int, Hashable] = {}  # address of a handle we handed out -> its lane
        self._lane_of_uuid: dict[str, Hashable] = {}
        self._listeners: list[StuckListener] = []
        self._closed = False

    def subscribe(self, listener: StuckListener) -> None:
        """Call `listener(call, stuck)` whenever a call gets stuck (True) or a stuck one returns (False)."""
        with self._lock:
            self._listeners.append(listener)

    def close(self) -> None:
        """Stop the lanes; one stuck in a call is left behind until that call returns."""
        with self._lock:
            self._closed = True
            lanes = list(self._lanes.values())
        for lane in lanes:
            lane.stop()

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
        key = self._lane_key(name, args)
        fn = getattr(self._inner, name)
        lane: _Lane | None = getattr(_on_lane, "lane", None)
        if lane is not None:  # inside a job: run here, on the job's lane, naming the call while it runs
            result = lane.inline(name, fn, args, kwargs)
        else:
            result = self._lane(key).call(_Call(name, fn, args, kwargs), self._deadline(name, args))
        self._learn(name, key, result)
        return result

    def _deadline(self, name: str, args: tuple[Any, ...]) -> float:
        if name == "nvmlInit":
            return max(self._timeout_s, INIT_TIMEOUT_S)
        if name == "nvmlEventSetWait_v2" and len(args) > 1 and isinstance(args[1], int):
            return self._timeout_s + args[1] / 1000.0
        return self._timeout_s

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

    def _learn(self, name: str, key: Hashable, result: Any) -> None:
        """Remember which lane the handles and UUIDs a call returned belong to."""
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
                    lane = _Lane(_lane_name(key), _lane_label(key), self._stuck)
                    self._lanes[key] = lane
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


_API = frozenset(api_functions())
_on_lane = threading.local()  # .lane: the _Lane whose thread this is (its jobs' calls run inline)


def on_lane(nv: NvmlApi, device: int | str, what: str, job: Callable[[], T], extra_s: float = 0.0) -> T:
    """`job()`, which calls `nv`, on `device`'s lane when `nv` is bounded (BoundedNvml.run_on); called
    directly otherwise (a bare simulator or pynvml in tests and tools)."""
    if isinstance(nv, BoundedNvml):
        return nv.run_on(device, what, job, extra_s)
    return job()


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

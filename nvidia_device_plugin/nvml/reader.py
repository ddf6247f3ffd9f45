"""One pynvml call at a time during discovery, with the failure policy in one place.

Discovery degrades per GPU and per call: a call that fails either gives a fallback value and a
DiscoveryProblem (the operator's log line), or, for a GPU_IS_LOST, raises GpuLost so the caller serves
that GPU as lost with what it read so far. Only failures that leave nothing to serve (counting GPUs)
stop discovery.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from nvidia_device_plugin.devices import DiscoveryProblem
from nvidia_device_plugin.nvml.api import NvmlApi
from nvidia_device_plugin.nvml.bounded import NvmlCallStuck, on_lane
from nvidia_device_plugin.nvml.errors import NVML_CALL_STUCK, NvmlErrorKind, classify, error_code, nvml_error

T = TypeVar("T")


class GpuLost(Exception):
    """NVML answered GPU_IS_LOST for a GPU while it was being read, or a call on it got stuck."""

    def __init__(self, call: str, stuck: bool = False) -> None:
        super().__init__(call)
        self.call = call
        self.stuck = stuck


class Reader:
    """Calls pynvml for discovery and collects the problems it tolerated, each once."""

    def __init__(self, nv: NvmlApi) -> None:
        self.nv = nv
        self.problems: list[DiscoveryProblem] = []
        self._seen: set[tuple[int | None, str, int]] = set()

    def call(
        self,
        fn: Callable[..., T],
        *args: Any,
        gpu: int | None,
        what: str,
        fallback: T,
        consequence: str,
        quiet: frozenset[NvmlErrorKind] = frozenset(),
    ) -> T:
        """`fn(*args)`, or `fallback` (with a problem saying `consequence`) when NVML fails.

        Errors of a kind in `quiet` give the fallback without a problem: they are normal on some nodes.
        GPU_IS_LOST raises GpuLost for a GPU call.
        """
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            if gpu is not None:
                raise_if_lost(exc, _name(fn))
            if classify(exc) not in quiet:
                self.note(gpu, _name(fn), error_code(exc), f"{nvml_error(exc, what)}; {consequence}")
            return fallback

    def on_gpu(self, index: int, what: str, job: Callable[[], T]) -> T:
        """`job()` on GPU `index`'s lane (nvml/bounded.py): its calls in one hand-over, within the call
        deadline. Raises GpuLost(stuck=True), naming the call, when it does not return in time."""
        try:
            return on_lane(self.nv, index, what, job)
        except NvmlCallStuck as exc:
            raise GpuLost(exc.call, stuck=True) from exc

    def note_lost(self, index: int, uuid: str, call: str, stuck: bool = False) -> None:
        """GPU `index` answered GPU_IS_LOST from `call` (or `call` got stuck on it): it is served as lost,
        and the problem says so."""
        if stuck:
            message = (
                f"GPU {index} ({uuid}): {call} is stuck in the NVIDIA driver; advertised as Unhealthy with "
                "what was read before, and read again once its calls return"
            )
            self.note(index, call, NVML_CALL_STUCK, message)
            return
        self.note(index, call, pynvml.NVML_ERROR_GPU_IS_LOST, lost_message(index, uuid, call))

    def note(self, gpu: int | None, call: str, code: int, message: str) -> None:
        key = (gpu, call, code)
        if key not in self._seen:
            self._seen.add(key)
            self.problems.append(DiscoveryProblem(gpu_index=gpu, call=call, code=code, message=message))


def lost_message(index: int, uuid: str, call: str) -> str:
    return (
        f"GPU {index} ({uuid}) is lost (GPU_IS_LOST from {call}); advertised as Unhealthy and checked "
        "again every poll"
    )


def raise_if_lost(exc: pynvml.NVMLError, call: str) -> None:
    """GpuLost when `exc` is GPU_IS_LOST (from `call`) or a stuck call (nvml/bounded.py): the caller then
    serves the GPU as lost."""
    kind = classify(exc)
    if kind is NvmlErrorKind.STUCK:
        raise GpuLost(getattr(exc, "call", call), stuck=True) from exc
    if kind is NvmlErrorKind.GPU_LOST:
        raise GpuLost(call) from exc


def _name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__name__", fn))

"""The one place that chooses real or simulated NVML: `--simulate NODE` (or NVDP_SIMULATE) picks the
simulator, anything else the real library. No module outside cli/ makes that choice."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from nvidia_device_plugin.nvml.deadlines import DEFAULT_CALL_TIMEOUT_S

if TYPE_CHECKING:
    from nvidia_device_plugin.nvml.session import NvmlSession
    from nvidia_device_plugin.nvml.sim.simulator import SimulatedNvml


def open_session(simulate: str | None) -> NvmlSession:
    """A session for a command that reads the node once (plan, labels, gpu-feature-discovery), or one
    whose daemon opens it when it starts (mps-control-daemon); the caller closes it."""
    from nvidia_device_plugin.nvml.session import open_nvml

    return open_nvml(simulate)


def nvml_opener(
    simulate: str | None, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
) -> tuple[Callable[[], NvmlSession], SimulatedNvml | None]:
    """How the daemon opens NVML, each call within `call_timeout_s` (--nvml-call-deadline): the real
    library, or (for --simulate) a simulated node made here, so that the caller can drive the simulator
    (inject events) while the daemon uses it like real NVML."""
    from nvidia_device_plugin.nvml.session import open_nvml

    if not simulate:
        return partial(open_nvml, None, call_timeout_s), None
    session = open_nvml(simulate, call_timeout_s)
    return (lambda: session), session.simulator

"""A GPU's compute time-slice: how long a CUDA context runs before the GPU switches to the next one.

NVIDIA's DRA driver sets it for a claim whose config asks for `TimeSlicing` with an interval, through
`nvidia-smi compute-policy -i <uuid> --set-timeslice <n>` (0 Default, 1 Short, 2 Medium, 3 Long). NVML
publishes no function for this policy (nvidia-smi reaches it through the driver directly), so the seam is
`TimeSliceControl`: `NvidiaSmiTimeSlice` runs nvidia-smi as NVIDIA does (bounded: a deadline, and the
output children.py keeps), and the simulator's `SimulatedTimeSlice` (nvml/sim/timeslice.py) keeps the
value per GPU and fails as a real node does (NOT_SUPPORTED on GPUs before Volta, NO_PERMISSION without
CAP_SYS_ADMIN). Either raises NvmlError naming the GPU, the interval and the reason, with the NVML code
of the failure.
"""

from __future__ import annotations

import logging
from typing import Final, Literal, Protocol

import pynvml

from nvidia_device_plugin.base.errors import NvmlError

log = logging.getLogger(__name__)

TimeSliceInterval = Literal["Default", "Short", "Medium", "Long"]
INTERVALS: Final[dict[TimeSliceInterval, int]] = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
NVIDIA_SMI = "nvidia-smi"
SET_TIMEOUT_S = 10.0  # one nvidia-smi call; kubelet gives a whole prepare 45 s


class TimeSliceControl(Protocol):
    """Sets a GPU's compute time-slice."""

    def set_time_slice(self, gpu_uuid: str, interval: TimeSliceInterval) -> None:
        """Set `gpu_uuid`'s time-slice to `interval`; NvmlError (with its NVML code) when that fails."""
        ...


def time_slice_error(gpu_uuid: str, interval: TimeSliceInterval, why: str, code: int | None) -> NvmlError:
    hint = " (the container needs CAP_SYS_ADMIN)" if code == pynvml.NVML_ERROR_NO_PERMISSION else ""
    return NvmlError(f"cannot set time-slice {interval} on GPU {gpu_uuid}: {why}{hint}", code)


class NvidiaSmiTimeSlice:
    """`nvidia-smi compute-policy --set-timeslice`, as NVIDIA's DRA driver sets it."""

    def __init__(self, nvidia_smi: str = NVIDIA_SMI, env: dict[str, str] | None = None) -> None:
        self._nvidia_smi = nvidia_smi
        self._env = dict(env or {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"})

    def set_time_slice(self, gpu_uuid: str, interval: TimeSliceInterval) -> None:
        argv = [
            self._nvidia_smi,
            "compute-policy",
            "-i",
            gpu_uuid,
            "--set-timeslice",
            str(INTERVALS[interval]),
        ]
        # Here, not at the top: only setting a time-slice runs a child, and every `run` imports this module.
        from nvidia_device_plugin.base import children

        try:
            outcome = children.run(argv, self._env, timeout_s=SET_TIMEOUT_S)
        except OSError as exc:
            raise time_slice_error(
                gpu_uuid, interval, f"cannot run {self._nvidia_smi}: {exc}", None
            ) from None
        if outcome.why_killed:
            raise time_slice_error(gpu_uuid, interval, f"{self._nvidia_smi} {outcome.why_killed}", None)
        if outcome.returncode != 0:
            output = outcome.output.strip()
            raise time_slice_error(
                gpu_uuid, interval, output or f"exit status {outcome.returncode}", _code(output)
            )
        log.info("GPU %s time-slice set to %s", gpu_uuid, interval)


def _code(output: str) -> int | None:
    """The NVML code nvidia-smi's message stands for, where it says one."""
    text = output.lower()
    if "not supported" in text:
        return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
    if "insufficient permissions" in text or "no permission" in text:
        return int(pynvml.NVML_ERROR_NO_PERMISSION)
    return None

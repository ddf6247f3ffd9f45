"""A GPU's compute mode: MPS needs EXCLUSIVE_PROCESS, so that only the MPS server opens a context on it.

With DEFAULT, a process that drops CUDA_MPS_PIPE_DIRECTORY would open its own context beside MPS and
escape its memory and thread limits. Setting the mode needs CAP_SYS_ADMIN; the error says so.
"""

from __future__ import annotations

import logging
from typing import Literal

import pynvml

from nvidia_device_plugin.base.errors import NvmlError
from nvidia_device_plugin.nvml.api import NvmlApi
from nvidia_device_plugin.nvml.errors import NvmlErrorKind, classify, error_code

log = logging.getLogger(__name__)

ComputeMode = Literal["DEFAULT", "EXCLUSIVE_PROCESS"]

_MODES: dict[ComputeMode, int] = {
    "DEFAULT": pynvml.NVML_COMPUTEMODE_DEFAULT,
    "EXCLUSIVE_PROCESS": pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
}
_NAMES = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: "DEFAULT",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "EXCLUSIVE_THREAD",
    pynvml.NVML_COMPUTEMODE_PROHIBITED: "PROHIBITED",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "EXCLUSIVE_PROCESS",
}


def set_compute_mode(nv: NvmlApi, gpu_uuid: str, mode: ComputeMode) -> None:
    """Set `gpu_uuid`'s compute mode to `mode` unless it is already; one log line when it changes.

    Raises NvmlError naming the GPU, the mode and, for NO_PERMISSION, the missing capability.
    """
    wanted = _MODES[mode]
    try:
        handle = nv.nvmlDeviceGetHandleByUUID(gpu_uuid)
        current = int(nv.nvmlDeviceGetComputeMode(handle))
        if current == wanted:
            return
        nv.nvmlDeviceSetComputeMode(handle, wanted)
    except pynvml.NVMLError as exc:
        hint = " (the container needs CAP_SYS_ADMIN)" if classify(exc) is NvmlErrorKind.NO_PERMISSION else ""
        message = f"cannot set compute mode {mode} on GPU {gpu_uuid}: {exc}{hint}"
        raise NvmlError(message, error_code(exc)) from exc
    log.info("GPU %s compute mode set to %s (was %s)", gpu_uuid, mode, _NAMES.get(current, str(current)))

"""Turning pynvml.NVMLError into NvmlError with a message an operator can act on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from nvidia_device_plugin.errors import NvmlError

T = TypeVar("T")

_HINTS = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "NVIDIA driver library not found: is this a GPU node?",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "NVIDIA driver is not loaded: is the kernel module installed?",
    pynvml.NVML_ERROR_NO_PERMISSION: "no permission to talk to the NVIDIA driver: run privileged or as root",
    pynvml.NVML_ERROR_GPU_IS_LOST: "GPU is lost (fell off the bus or needs a reset)",
    pynvml.NVML_ERROR_UNINITIALIZED: "NVML was not initialised",
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "the NVIDIA driver is too old for this call",
}


def nvml_error(exc: pynvml.NVMLError, what: str) -> NvmlError:
    code = int(exc.value)
    hint = _HINTS.get(code, str(exc))
    return NvmlError(f"{what}: {hint} (NVML error {code})", code=code)


def nvml_call(fn: Callable[..., T], *args: Any, what: str) -> T:
    """Call one pynvml function, raising NvmlError that says what we were doing."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise nvml_error(exc, what) from exc

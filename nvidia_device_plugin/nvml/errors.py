"""What an NVML error means, decided in one table: its kind, and the words an operator reads for it.

Every caller of NVML asks here (`classify`, `NvmlFailure.kind`, `nvml_error`) instead of comparing return
codes itself. What a kind means where it is met (an empty MIG slot, a link the GPU does not have, a probe
of a GPU the driver no longer lists) is decided by that caller and written beside the call.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from nvidia_device_plugin.base.errors import NvmlError

T = TypeVar("T")


class NvmlErrorKind(enum.Enum):
    GPU_LOST = "GPU is lost"  # fell off the bus or needs a reset: the GPU is served as lost
    NOT_FOUND = "not found"  # no such object: a GPU the driver no longer lists, an empty MIG slot
    NOT_SUPPORTED = "not supported"  # this GPU or driver lacks the feature
    INVALID_ARGUMENT = "invalid argument"  # no such index on this device (an NVLink, a MIG slot)
    CALL_MISSING = "call missing"  # the driver is too old to have this call
    NO_PERMISSION = "no permission"  # in a container: not privileged, or without a capability
    TIMEOUT = "timeout"  # an event wait ended with nothing to read
    IN_USE = "in use"  # a MIG instance a process holds, or a GPU instance that still has compute instances
    INSUFFICIENT_RESOURCES = "insufficient resources"  # the MIG slices a new instance needs are taken
    STUCK = "stuck"  # the call did not return within its deadline (nvml/bounded.py): served as lost
    NO_DRIVER = "no driver"  # no driver library or kernel module: nothing can be served
    UNINITIALIZED = "uninitialized"  # NVML was not initialised (a bug of ours)
    SHUTTING_DOWN = "shutting down"  # the process is stopping: the call was not waited for (nvml/bounded.py)
    OTHER = "other"  # anything else, UNKNOWN among them: real drivers return it transiently


# Not NVML return codes: what nvml/bounded.py's NvmlCallStuck and NvmlShuttingDown carry (NVML's own codes
# stay below 1000).
NVML_CALL_STUCK = 1000
NVML_SHUTTING_DOWN = 1001

# NVML return code -> (kind, what an operator reads instead of pynvml's text; None: pynvml's text).
_CODES: dict[int, tuple[NvmlErrorKind, str | None]] = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        NvmlErrorKind.NO_DRIVER,
        "NVIDIA driver library not found: is this a GPU node?",
    ),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: (
        NvmlErrorKind.NO_DRIVER,
        "NVIDIA driver is not loaded: is the kernel module installed?",
    ),
    pynvml.NVML_ERROR_NO_PERMISSION: (
        NvmlErrorKind.NO_PERMISSION,
        "no permission to talk to the NVIDIA driver: run privileged or as root",
    ),
    pynvml.NVML_ERROR_GPU_IS_LOST: (
        NvmlErrorKind.GPU_LOST,
        "GPU is lost (fell off the bus or needs a reset)",
    ),
    pynvml.NVML_ERROR_UNINITIALIZED: (NvmlErrorKind.UNINITIALIZED, "NVML was not initialised"),
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: (
        NvmlErrorKind.CALL_MISSING,
        "the NVIDIA driver is too old for this call",
    ),
    pynvml.NVML_ERROR_NOT_FOUND: (NvmlErrorKind.NOT_FOUND, None),
    pynvml.NVML_ERROR_NOT_SUPPORTED: (NvmlErrorKind.NOT_SUPPORTED, None),
    pynvml.NVML_ERROR_INVALID_ARGUMENT: (NvmlErrorKind.INVALID_ARGUMENT, None),
    pynvml.NVML_ERROR_TIMEOUT: (NvmlErrorKind.TIMEOUT, None),
    pynvml.NVML_ERROR_IN_USE: (
        NvmlErrorKind.IN_USE,
        "the MIG instance is in use (a process holds it, or its GPU instance still has compute instances)",
    ),
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: (
        NvmlErrorKind.INSUFFICIENT_RESOURCES,
        "not enough free MIG slices: another instance holds the memory slices of that placement, or the "
        "profile's instance count is reached",
    ),
    NVML_CALL_STUCK: (NvmlErrorKind.STUCK, None),
    NVML_SHUTTING_DOWN: (NvmlErrorKind.SHUTTING_DOWN, None),
}

# What a device answers for a feature or an index it does not have: MIG mode on a pre-Ampere GPU, an
# NVLink beyond the ones it has. Discovery takes both as "absent", never as a problem.
ABSENT = frozenset({NvmlErrorKind.NOT_SUPPORTED, NvmlErrorKind.INVALID_ARGUMENT})

# What a GPU is served as lost for: NVML says it is, or a call on it never returned.
LOST = frozenset({NvmlErrorKind.GPU_LOST, NvmlErrorKind.STUCK})


def error_code(exc: BaseException) -> int:
    """NVML's return code of `exc` (-1 for an exception that is not an NVMLError)."""
    return int(exc.value) if isinstance(exc, pynvml.NVMLError) else -1


def classify(exc: BaseException) -> NvmlErrorKind:
    """The kind of NVML error `exc` is (OTHER for codes without a kind of their own, and non-NVML errors)."""
    return kind_of_code(error_code(exc))


def kind_of_code(code: int) -> NvmlErrorKind:
    """The kind of NVML return code `code` (as a DiscoveryProblem keeps it); OTHER for codes without one."""
    entry = _CODES.get(code)
    return entry[0] if entry is not None else NvmlErrorKind.OTHER


def means_lost(code: int) -> bool:
    """Whether NVML return code `code` takes a GPU out as lost (GPU_IS_LOST, or a call stuck)."""
    return kind_of_code(code) in LOST


def describe(exc: pynvml.NVMLError) -> str:
    """What `exc` says to an operator: the table's words where it has them, else pynvml's."""
    entry = _CODES.get(error_code(exc))
    hint = entry[1] if entry is not None else None
    return hint if hint is not None else str(exc)


def nvml_error(exc: pynvml.NVMLError, what: str) -> NvmlError:
    code = error_code(exc)
    return NvmlError(f"{what}: {describe(exc)} (NVML error {code})", code=code)


def nvml_call(fn: Callable[..., T], *args: Any, what: str) -> T:
    """Call one pynvml function, raising NvmlError that says what we were doing."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise nvml_error(exc, what) from exc

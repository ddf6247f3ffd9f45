"""The one table of what an NVML error is: kinds and operator words, for every code a caller decides on."""

from __future__ import annotations

import pynvml
import pytest

from nvidia_device_plugin.nvml.errors import (
    NVML_CALL_STUCK,
    NvmlErrorKind,
    classify,
    describe,
    means_lost,
    nvml_error,
)
from nvidia_device_plugin.nvml.events import NvmlFailure


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (pynvml.NVML_ERROR_GPU_IS_LOST, NvmlErrorKind.GPU_LOST),
        (pynvml.NVML_ERROR_NOT_FOUND, NvmlErrorKind.NOT_FOUND),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, NvmlErrorKind.NOT_SUPPORTED),
        (pynvml.NVML_ERROR_INVALID_ARGUMENT, NvmlErrorKind.INVALID_ARGUMENT),
        (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, NvmlErrorKind.CALL_MISSING),
        (pynvml.NVML_ERROR_NO_PERMISSION, NvmlErrorKind.NO_PERMISSION),
        (pynvml.NVML_ERROR_TIMEOUT, NvmlErrorKind.TIMEOUT),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, NvmlErrorKind.NO_DRIVER),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, NvmlErrorKind.NO_DRIVER),
        (pynvml.NVML_ERROR_UNINITIALIZED, NvmlErrorKind.UNINITIALIZED),
        (pynvml.NVML_ERROR_UNKNOWN, NvmlErrorKind.OTHER),
        (pynvml.NVML_ERROR_INSUFFICIENT_POWER, NvmlErrorKind.OTHER),
    ],
)
def test_each_code_has_one_kind(code: int, kind: NvmlErrorKind) -> None:
    assert classify(pynvml.NVMLError(code)) is kind


def test_what_is_not_an_nvml_error_is_other() -> None:
    assert classify(ValueError("x")) is NvmlErrorKind.OTHER


def test_operator_words_replace_pynvml_text_where_the_table_has_them() -> None:
    lost = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    assert describe(lost) == "GPU is lost (fell off the bus or needs a reset)"
    assert str(nvml_error(lost, "reading GPU 3")) == (
        "reading GPU 3: GPU is lost (fell off the bus or needs a reset) (NVML error 15)"
    )
    unknown = pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
    assert describe(unknown) == str(unknown) == "Unknown Error"
    assert nvml_error(unknown, "x").code == pynvml.NVML_ERROR_UNKNOWN


def test_the_monitor_s_questions_follow_the_kinds() -> None:
    def failure(code: int) -> NvmlFailure:
        return NvmlFailure(pynvml.NVMLError(code))

    assert failure(pynvml.NVML_ERROR_GPU_IS_LOST).gpu_is_lost
    assert failure(pynvml.NVML_ERROR_GPU_IS_LOST).means_lost
    assert failure(pynvml.NVML_ERROR_NOT_FOUND).means_lost
    assert not failure(pynvml.NVML_ERROR_NOT_FOUND).gpu_is_lost
    assert not failure(pynvml.NVML_ERROR_UNKNOWN).means_lost  # transient: counted, not lost at once
    assert failure(pynvml.NVML_ERROR_NOT_SUPPORTED).not_supported
    assert failure(pynvml.NVML_ERROR_NO_PERMISSION).no_permission
    assert str(failure(pynvml.NVML_ERROR_UNKNOWN)) == "Unknown Error (NVML error 999)"


def test_a_return_code_says_whether_the_gpu_is_lost() -> None:
    """What snapshot.py asks of a discovery problem's code, so that it needs no pynvml of its own."""
    assert means_lost(pynvml.NVML_ERROR_GPU_IS_LOST) and means_lost(NVML_CALL_STUCK)
    assert not any(
        means_lost(code)
        for code in (
            pynvml.NVML_ERROR_NOT_FOUND,
            pynvml.NVML_ERROR_UNKNOWN,
            pynvml.NVML_ERROR_NOT_SUPPORTED,
            -1,
        )
    )

"""A GPU's compute time-slice through nvidia-smi (a stand-in script) and through the simulator: the
command NVIDIA's DRA driver runs, and failures that name the GPU, the interval and the reason with its
NVML code."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from nvidia_device_plugin.base.errors import NvmlError
from nvidia_device_plugin.nvml.sim.timeslice import SimulatedTimeSlice
from nvidia_device_plugin.nvml.timeslice import NvidiaSmiTimeSlice

GPU = "GPU-4f1c0a2e-0000-1111-2222-333344445555"
FAKE_SMI = """#!/bin/sh
echo "$*" >> "__DIR__/calls"
if [ -e "__DIR__/answer" ]; then cat "__DIR__/answer"; exit 3; fi
"""


@pytest.fixture
def smi(tmp_path: Path) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text(FAKE_SMI.replace("__DIR__", str(tmp_path)))
    path.chmod(0o755)
    return str(path)


def test_nvidia_smi_is_asked_for_the_interval_as_nvidias_driver_asks(tmp_path: Path, smi: str) -> None:
    NvidiaSmiTimeSlice(smi).set_time_slice(GPU, "Medium")
    assert (tmp_path / "calls").read_text() == f"compute-policy -i {GPU} --set-timeslice 2\n"


@pytest.mark.parametrize(
    ("answer", "code", "hint"),
    [
        ("Setting time-slice is Not Supported for GPU", pynvml.NVML_ERROR_NOT_SUPPORTED, ""),
        ("Insufficient Permissions", pynvml.NVML_ERROR_NO_PERMISSION, " (the container needs CAP_SYS_ADMIN)"),
        ("Unknown Error", None, ""),
    ],
)
def test_nvidia_smis_refusal_names_the_gpu_the_interval_and_why(
    tmp_path: Path, smi: str, answer: str, code: int | None, hint: str
) -> None:
    (tmp_path / "answer").write_text(answer + "\n")
    with pytest.raises(NvmlError) as raised:
        NvidiaSmiTimeSlice(smi).set_time_slice(GPU, "Long")
    assert str(raised.value) == f"cannot set time-slice Long on GPU {GPU}: {answer}{hint}"
    assert raised.value.code == code


def test_a_missing_nvidia_smi_is_named(tmp_path: Path) -> None:
    with pytest.raises(NvmlError, match=f"cannot set time-slice Short on GPU {GPU}: cannot run .*no-smi"):
        NvidiaSmiTimeSlice(str(tmp_path / "no-smi")).set_time_slice(GPU, "Short")


def test_the_simulator_keeps_each_gpus_interval_and_fails_as_told() -> None:
    sim = SimulatedTimeSlice([GPU])
    assert sim.interval(GPU) == "Default"
    sim.set_time_slice(GPU, "Short")
    assert sim.interval(GPU) == "Short"
    sim.fail(GPU, pynvml.NVML_ERROR_NOT_SUPPORTED)
    with pytest.raises(NvmlError, match="Not Supported") as raised:
        sim.set_time_slice(GPU, "Long")
    assert raised.value.code == pynvml.NVML_ERROR_NOT_SUPPORTED and sim.interval(GPU) == "Short"
    with pytest.raises(NvmlError, match="No devices were found"):
        sim.set_time_slice("GPU-other", "Long")

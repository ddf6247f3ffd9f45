"""The product's NVML code on the real nvidia-ml-py module (ctypes into libnvidia-ml), not the simulator.

Runs where a libnvidia-ml.so.1 loads (a GPU node, or an NVML mock library on the loader path); elsewhere
it is skipped with the loader's reason.
"""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.events import probe


@pytest.fixture
def real_nvml() -> object:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no usable libnvidia-ml on this machine (pynvml.nvmlInit: {exc}); runs on GPU nodes")
    yield pynvml
    pynvml.nvmlShutdown()


def test_discovery_and_probes_run_on_the_real_pynvml_module(real_nvml: object) -> None:
    inventory = discover(pynvml, Path("/sys"), Path("/proc"))
    for problem in inventory.problems:
        print("discovery problem:", problem.message)
    for gpu in inventory.gpus:
        assert gpu.uuid.startswith("GPU-")
        assert probe(pynvml, gpu.uuid).state in ("ok", "unknown")
        for mig in gpu.mig_devices:
            assert mig.uuid.startswith("MIG-") and mig.profile[0].isdigit()

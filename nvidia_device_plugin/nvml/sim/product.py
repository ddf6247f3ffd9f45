"""What the simulated GPUs answer for nvmlDeviceGetBrand and nvmlDeviceGetArchitecture, from the product
name and the compute capability the node file gives (or derives) for them."""

from __future__ import annotations

import re

import pynvml

from nvidia_device_plugin.nvml.sim.state import _nvml_error

# First match wins: data-center GPUs since Ampere say NVIDIA; older ones Tesla.
_BRANDS = (
    (re.compile(r"^Tesla |V100|P100|\bP4\b|P40|\bT4\b"), pynvml.NVML_BRAND_TESLA),
    (re.compile(r"Quadro RTX"), pynvml.NVML_BRAND_QUADRO_RTX),
    (re.compile(r"Quadro"), pynvml.NVML_BRAND_QUADRO),
    (re.compile(r"GeForce RTX"), pynvml.NVML_BRAND_GEFORCE_RTX),
    (re.compile(r"GeForce"), pynvml.NVML_BRAND_GEFORCE),
    (re.compile(r"NVIDIA RTX|RTX A\d000|RTX PRO"), pynvml.NVML_BRAND_NVIDIA_RTX),
)
# By compute-capability major (and minor, where one major spans two architectures).
_ARCHITECTURES = {
    6: pynvml.NVML_DEVICE_ARCH_PASCAL,
    7: pynvml.NVML_DEVICE_ARCH_VOLTA,
    8: pynvml.NVML_DEVICE_ARCH_AMPERE,
    9: pynvml.NVML_DEVICE_ARCH_HOPPER,
    10: pynvml.NVML_DEVICE_ARCH_BLACKWELL,
    12: pynvml.NVML_DEVICE_ARCH_BLACKWELL,
}


def product_brand(name: str) -> int:
    return int(next((brand for pattern, brand in _BRANDS if pattern.search(name)), pynvml.NVML_BRAND_NVIDIA))


def product_architecture(compute_capability: tuple[int, int] | None) -> int:
    """NOT_SUPPORTED where the node file says NVML gives no compute capability either."""
    if compute_capability is None:
        raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    if compute_capability == (7, 5):
        return int(pynvml.NVML_DEVICE_ARCH_TURING)
    if compute_capability == (8, 9):
        return int(pynvml.NVML_DEVICE_ARCH_ADA)
    return int(_ARCHITECTURES.get(compute_capability[0], pynvml.NVML_DEVICE_ARCH_UNKNOWN))

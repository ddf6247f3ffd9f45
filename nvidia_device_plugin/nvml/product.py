"""A GPU's brand and architecture as NVML names them, spelt as NVIDIA's go-nvlib spells them ("Nvidia",
"Tesla"; "Ampere", "Ada Lovelace"): the `brand` and `architecture` attributes of NVIDIA's DRA driver.

Both are read for DRA only; a failure leaves the attribute out (a DiscoveryProblem says so), and
NOT_SUPPORTED quietly.
"""

from __future__ import annotations

import pynvml

from nvidia_device_plugin.nvml.api import DeviceHandle
from nvidia_device_plugin.nvml.errors import NvmlErrorKind
from nvidia_device_plugin.nvml.reader import Reader

_P = pynvml
BRANDS = {
    _P.NVML_BRAND_UNKNOWN: "Unknown",
    _P.NVML_BRAND_QUADRO: "Quadro",
    _P.NVML_BRAND_TESLA: "Tesla",
    _P.NVML_BRAND_NVS: "NVS",
    _P.NVML_BRAND_GRID: "Grid",
    _P.NVML_BRAND_GEFORCE: "GeForce",
    _P.NVML_BRAND_TITAN: "Titan",
    _P.NVML_BRAND_NVIDIA_VAPPS: "NvidiaVApps",
    _P.NVML_BRAND_NVIDIA_VPC: "NvidiaVPC",
    _P.NVML_BRAND_NVIDIA_VCS: "NvidiaVCS",
    _P.NVML_BRAND_NVIDIA_VWS: "NvidiaVWS",
    _P.NVML_BRAND_NVIDIA_CLOUD_GAMING: "NvidiaCloudGaming",
    _P.NVML_BRAND_QUADRO_RTX: "QuadroRTX",
    _P.NVML_BRAND_NVIDIA_RTX: "NvidiaRTX",
    _P.NVML_BRAND_NVIDIA: "Nvidia",
    _P.NVML_BRAND_GEFORCE_RTX: "GeForceRTX",
    _P.NVML_BRAND_TITAN_RTX: "TitanRTX",
}
ARCHITECTURES = {
    _P.NVML_DEVICE_ARCH_KEPLER: "Kepler",
    _P.NVML_DEVICE_ARCH_MAXWELL: "Maxwell",
    _P.NVML_DEVICE_ARCH_PASCAL: "Pascal",
    _P.NVML_DEVICE_ARCH_VOLTA: "Volta",
    _P.NVML_DEVICE_ARCH_TURING: "Turing",
    _P.NVML_DEVICE_ARCH_AMPERE: "Ampere",
    _P.NVML_DEVICE_ARCH_ADA: "Ada Lovelace",
    _P.NVML_DEVICE_ARCH_HOPPER: "Hopper",
    _P.NVML_DEVICE_ARCH_BLACKWELL: "Blackwell",
    _P.NVML_DEVICE_ARCH_UNKNOWN: "Unknown",
}
_NOT_SUPPORTED = frozenset({NvmlErrorKind.NOT_SUPPORTED})


def read_brand_and_architecture(
    reader: Reader, handle: DeviceHandle, index: int
) -> tuple[str | None, str | None]:
    """(brand, architecture) of GPU `index`; None for what NVML will not say or names with a number we
    do not know (a newer driver's)."""
    nv = reader.nv
    brand = reader.call(
        nv.nvmlDeviceGetBrand,
        handle,
        gpu=index,
        what=f"reading the brand of GPU {index}",
        fallback=None,
        consequence="its DRA brand attribute is left out",
        quiet=_NOT_SUPPORTED,
    )
    arch = reader.call(
        nv.nvmlDeviceGetArchitecture,
        handle,
        gpu=index,
        what=f"reading the architecture of GPU {index}",
        fallback=None,
        consequence="its DRA architecture attribute is left out",
        quiet=_NOT_SUPPORTED,
    )
    return (
        BRANDS.get(int(brand)) if brand is not None else None,
        ARCHITECTURES.get(int(arch)) if arch is not None else None,
    )

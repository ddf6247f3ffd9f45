"""NVIDIA's opaque device config (`resource.nvidia.com/v1beta1` GpuConfig, MigDeviceConfig): parsed,
checked, defaulted and matched to a claim's devices, as NVIDIA's DRA driver reads it.

A claim's `status.allocation.devices.config` lists the configs of its DeviceClasses (`source: FromClass`)
and of the claim itself (`FromClaim`); those whose `opaque.driver` is this driver are read here. They are
taken class configs first, then claim configs, each group in its order; the last one that applies to a
device wins. A config applies to the results of the requests its `requests` names (every request when
empty), and only to devices of its kind: GpuConfig to whole GPUs, MigDeviceConfig to MIG devices (one that
names a request whose device is of the other kind is an error).

Defaults are NVIDIA's Normalize(): no `sharing` means TimeSlicing; TimeSlicing on a GPU without an interval
means `Default`; MPS without `mpsConfig` means no client limits. Anything else is a ClaimError that names
the config, the field and the value: an unknown apiVersion, kind, field, strategy or interval, a config of
one strategy carrying the other's settings, a thread percentage outside 0..100, a memory limit that is not
a quantity of at least 1 MiB, a per-device limit naming no device of the claim. What a device gets is a
`DeviceSharing`: its sharing mode (config/sharing_modes.py), and the interval or MPS settings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final, cast

from kubernetes.utils import parse_quantity

from nvidia_device_plugin.config.sharing_modes import MPS, TIME_SLICING, SharingModeFacts
from nvidia_device_plugin.dra.kubelet.model import ClaimError
from nvidia_device_plugin.nvml.timeslice import INTERVALS, TimeSliceInterval

API_VERSION: Final = "resource.nvidia.com/v1beta1"
GPU_CONFIG: Final = "GpuConfig"
MIG_DEVICE_CONFIG: Final = "MigDeviceConfig"
STRATEGIES: Final[dict[str, SharingModeFacts]] = {"TimeSlicing": TIME_SLICING, "MPS": MPS}
MAX_CONFIGS = 128  # entries of a claim's allocation config: the API allows 64 (class and claim together)
_MIB = 1024 * 1024
_parse_quantity = cast(Callable[[object], Decimal], parse_quantity)  # kubernetes.utils has no annotations
_SHARING_FIELDS: Final = {
    GPU_CONFIG: ("strategy", "timeSlicingConfig", "mpsConfig"),
    MIG_DEVICE_CONFIG: ("strategy", "mpsConfig"),
}
_MPS_FIELDS: Final = (
    "defaultActiveThreadPercentage",
    "defaultPinnedDeviceMemoryLimit",
    "defaultPerDevicePinnedMemoryLimit",
)


@dataclass(frozen=True)
class MpsSettings:
    """An mpsConfig: the defaults its control daemon gives clients (None: not set, the daemon's own)."""

    active_thread_percentage: int | None = None
    pinned_memory_limit_mib: int | None = None  # every device of the claim
    per_device_pinned_memory_limit_mib: tuple[tuple[str, int], ...] = ()  # device index or UUID -> MiB

    def pinned_limit_for(self, index: int, uuid: str) -> int | None:
        """The limit of the claim's `index`th MPS device (UUID `uuid`): its own entry, else the default."""
        own = dict(self.per_device_pinned_memory_limit_mib)
        return own.get(uuid, own.get(str(index), self.pinned_memory_limit_mib))


@dataclass(frozen=True)
class DeviceSharing:
    """What one config asks of the devices it applies to; equal when they ask the same (wherever from)."""

    mode: SharingModeFacts
    interval: TimeSliceInterval | None = None  # time-slicing of a whole GPU
    mps: MpsSettings | None = None
    where: str = field(default="", compare=False)  # "config[1] (FromClaim)", for messages

    def describe(self) -> str:
        if self.interval is not None:
            return f"{self.mode.name} (interval {self.interval})"
        return self.mode.name


@dataclass(frozen=True)
class OpaqueConfig:
    """One of this driver's configs of a claim, checked."""

    kind: str  # GPU_CONFIG or MIG_DEVICE_CONFIG
    requests: tuple[str, ...]  # empty: every request
    sharing: DeviceSharing

    def names(self, request: str, subrequest: str) -> bool:
        return not self.requests or request in self.requests or subrequest in self.requests


def opaque_configs(configs: Any, driver: str) -> tuple[OpaqueConfig, ...]:
    """This driver's configs of `configs` (status.allocation.devices.config), class ones first."""
    if not isinstance(configs, list):
        raise ClaimError("status.allocation.devices.config is not a list")
    if len(configs) > MAX_CONFIGS:
        raise ClaimError(f"status.allocation.devices.config has {len(configs)} entries, over {MAX_CONFIGS}")
    ordered: dict[str, list[OpaqueConfig]] = {"FromClass": [], "FromClaim": []}
    for n, entry in enumerate(configs):
        if not isinstance(entry, dict):
            raise ClaimError(f"status.allocation.devices.config[{n}] is not an object")
        opaque = entry.get("opaque")
        if not isinstance(opaque, dict) or opaque.get("driver") != driver:
            continue  # another driver's config, or not opaque: not ours to read
        source = entry.get("source")
        where = f"status.allocation.devices.config[{n}] ({source})"
        if source not in ordered:
            raise ClaimError(f"{where}: source must be FromClass or FromClaim")
        requests = entry.get("requests") or []
        if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
            raise ClaimError(f"{where}: requests is not a list of request names")
        kind, sharing = _parse_parameters(opaque.get("parameters"), where)
        ordered[source].append(OpaqueConfig(kind, tuple(requests), sharing))
    return (*ordered["FromClass"], *ordered["FromClaim"])


def sharing_of(
    configs: Sequence[OpaqueConfig], request: str, subrequest: str, device: str, is_mig: bool
) -> DeviceSharing | None:
    """What the last config applying to `device` (allocated for `request`) asks; None when none does."""
    kind = MIG_DEVICE_CONFIG if is_mig else GPU_CONFIG
    chosen = None
    for config in configs:
        if not config.names(request, subrequest):
            continue
        if config.kind == kind:
            chosen = config.sharing
        elif config.requests:
            wanted = "MigDeviceConfig" if is_mig else "GpuConfig"
            raise ClaimError(
                f"{config.sharing.where}: a {config.kind} names request {subrequest!r}, whose device "
                f"{device} is {'a MIG device' if is_mig else 'a whole GPU'}; use {wanted}"
            )
    return chosen


def _parse_parameters(parameters: Any, where: str) -> tuple[str, DeviceSharing]:
    if not isinstance(parameters, dict):
        raise ClaimError(f"{where}: opaque.parameters is not an object")
    api_version, kind = parameters.get("apiVersion"), parameters.get("kind")
    if api_version != API_VERSION:
        raise ClaimError(f"{where}: apiVersion {api_version!r} is not {API_VERSION}")
    if kind not in _SHARING_FIELDS:
        raise ClaimError(f"{where}: unknown kind {kind!r} (known: {GPU_CONFIG}, {MIG_DEVICE_CONFIG})")
    where = f"{where} {kind}"
    _known_fields(parameters, ("apiVersion", "kind", "sharing"), where)
    sharing = parameters.get("sharing")
    if sharing is None:  # NVIDIA's Normalize(): time-slicing
        return kind, DeviceSharing(TIME_SLICING, "Default" if kind == GPU_CONFIG else None, where=where)
    if not isinstance(sharing, dict):
        raise ClaimError(f"{where}: sharing is not an object")
    _known_fields(sharing, _SHARING_FIELDS[kind], f"{where} sharing")
    strategy = sharing.get("strategy")
    mode = STRATEGIES.get(strategy) if isinstance(strategy, str) else None
    if mode is None:
        raise ClaimError(
            f"{where}: unknown sharing.strategy {strategy!r} (known: {', '.join(STRATEGIES)}; "
            "Fabric is not enabled)"
        )
    own, other = (
        ("timeSlicingConfig", "mpsConfig") if mode is TIME_SLICING else ("mpsConfig", "timeSlicingConfig")
    )
    if sharing.get(other) is not None:
        raise ClaimError(f"{where}: sharing.{other} cannot be used with the {strategy} strategy")
    if mode is MPS:
        return kind, DeviceSharing(
            MPS, mps=_mps_settings(sharing.get(own), f"{where} sharing.{own}"), where=where
        )
    interval = _interval(sharing.get(own), f"{where} sharing.{own}") if kind == GPU_CONFIG else None
    return kind, DeviceSharing(TIME_SLICING, interval, where=where)


def _interval(config: Any, where: str) -> TimeSliceInterval:
    if config is None:
        return "Default"
    if not isinstance(config, dict):
        raise ClaimError(f"{where} is not an object")
    _known_fields(config, ("interval",), where)
    interval = config.get("interval", "Default")
    if interval not in INTERVALS:
        raise ClaimError(
            f"{where}.interval: unknown time-slice interval {interval!r} ({', '.join(INTERVALS)})"
        )
    return cast(TimeSliceInterval, interval)


def _mps_settings(config: Any, where: str) -> MpsSettings:
    if config is None:
        return MpsSettings()
    if not isinstance(config, dict):
        raise ClaimError(f"{where} is not an object")
    _known_fields(config, _MPS_FIELDS, where)
    percentage = config.get("defaultActiveThreadPercentage")
    if percentage is not None and (type(percentage) is not int or not 0 <= percentage <= 100):
        raise ClaimError(
            f"{where}.defaultActiveThreadPercentage must be an integer 0..100, got {percentage!r}"
        )
    default = config.get("defaultPinnedDeviceMemoryLimit")
    limit = None if default is None else _mib(default, f"{where}.defaultPinnedDeviceMemoryLimit")
    per_device = config.get("defaultPerDevicePinnedMemoryLimit") or {}
    if not isinstance(per_device, Mapping):
        raise ClaimError(f"{where}.defaultPerDevicePinnedMemoryLimit is not a map of device to limit")
    limits = tuple(
        (str(key), _mib(value, f"{where}.defaultPerDevicePinnedMemoryLimit[{key}]"))
        for key, value in per_device.items()
    )
    return MpsSettings(percentage, limit, limits)


def _mib(quantity: Any, where: str) -> int:
    """A Kubernetes quantity ("16Gi", "512M") in whole MiB, at least 1."""
    try:
        value = _parse_quantity(quantity) if isinstance(quantity, (str, int)) else None
        mib = int(value) // _MIB if isinstance(value, Decimal) else None
    except (ValueError, ArithmeticError):  # ArithmeticError: "1e9999999" and the like
        mib = None
    if mib is None:
        raise ClaimError(f"{where}: {quantity!r} is not a quantity (e.g. 16Gi)")
    if mib < 1:
        raise ClaimError(f"{where}: {quantity!r} is under 1 MiB")
    return mib


def _known_fields(document: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    unknown = sorted(set(document) - set(known))
    if unknown:
        raise ClaimError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(known)})")

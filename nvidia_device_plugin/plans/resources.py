"""The resources a node advertises: their devices, the device IDs inside them, and the names devices go under.

This module is the one place that builds and parses advertised device IDs (`<uuid>::<replica>`), and the one
place that decides which resource name each physical device is advertised under before sharing
(`base_resources`); resource_plans.py turns an inventory and a config into the plans served. It follows
NVIDIA's k8s-device-plugin (internal/rm/device_map.go; api/config/v1):

* MIG strategy `none`: whole GPUs only; a GPU in MIG mode is still advertised as a whole GPU. `single`:
  MIG devices are advertised as `nvidia.com/gpu`. `mixed`: one resource per MIG profile,
  `nvidia.com/mig-<profile>`, and whole GPUs for the GPUs not in MIG mode.
* Renames: `resources.gpus` patterns are matched against the GPU product name, `resources.mig` patterns
  against the MIG profile, first match wins. A pattern is a `*`-glob matched against the whole name
  (anchored, as NVIDIA's v0.20 `ResourcePattern.Matches`), so "*A100*" matches "NVIDIA A100-SXM4-80GB"
  and "A100" does not; "1g.10gb" does not match "1g.10gb+me". User patterns come first; NVIDIA's
  defaults (`*` -> gpu; under `single` also MIG `*` -> gpu; under `mixed` each profile -> mig-<profile>,
  "+" written as ".") catch the rest.

NVIDIA's released plugin drops `resources` at start-up (DisableResourceNamingInConfig); here the patterns
take effect, as its resource manager would apply them.

Default MIG resources are one per profile present, as NVIDIA v0.20's anchored default patterns give (where
NVIDIA is silent on the compute-instance case): "1g.10gb+me" gets its own `mig-1g.10gb.me`, "1g.10gb-me"
`mig-1g.10gb-me`. A compute-instance profile such as "1c.3g.40gb" goes to `mig-3g.40gb`, with its GPU
instance.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from types import MappingProxyType
from typing import Literal

from nvidia_device_plugin.config.v1 import (
    RESOURCE_PREFIX,
    MigStrategy,
    ResourcePattern,
    Resources,
    SharingMode,
    advertises_mig_devices,
)
from nvidia_device_plugin.devices import Gpu, MigDevice

REPLICA_SEPARATOR = "::"
DEFAULT_GPU_RESOURCE = f"{RESOURCE_PREFIX}/gpu"

_COMPUTE_INSTANCE_PREFIX = re.compile(r"^\d+c\.")


def replica_id(physical_uuid: str, replica: int) -> str:
    return f"{physical_uuid}{REPLICA_SEPARATOR}{replica}"


def physical_uuid_of(device_id: str) -> str:
    """The GPU or MIG UUID behind an advertised ID (the ID itself when it is not a replica)."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


@dataclass(frozen=True)
class AdvertisedDevice:
    """One device ID kubelet sees, and the physical device behind it."""

    id: str
    kind: Literal["gpu", "mig"]
    physical_uuid: str  # what goes into NVIDIA_VISIBLE_DEVICES: GPU UUID or MIG UUID
    gpu_uuid: str  # the physical GPU it lives on (== physical_uuid for whole GPUs)
    gpu_index: int
    mig_index: int | None  # index among the GPU's MIG devices; None for whole GPUs
    replica: int | None  # replica number when shared; None otherwise
    numa_node: int | None
    memory_bytes: int  # of the physical device behind it (GPU or MIG slice), before sharing

    @property
    def index_id(self) -> str:
        """The `index` device-ID strategy's name for the physical device: "3" or "3:1" for MIG."""
        if self.mig_index is None:
            return str(self.gpu_index)
        return f"{self.gpu_index}:{self.mig_index}"

    @property
    def label(self) -> str:
        """How messages name the device behind this ID: "GPU 3 (GPU-...)", "MIG device 3:1 (MIG-...)"."""
        if self.mig_index is None:
            return self.gpu_label
        return f"MIG device {self.index_id} ({self.physical_uuid})"

    @property
    def gpu_label(self) -> str:
        """How messages name the GPU this device lives on: "GPU 3 (GPU-...)", as Gpu.label does."""
        return f"GPU {self.gpu_index} ({self.gpu_uuid})"


@dataclass(frozen=True)
class ResourcePlan:
    """One advertised resource (one gRPC server, one kubelet registration)."""

    name: str  # fully qualified, e.g. "nvidia.com/gpu" or "nvidia.com/mig-1g.10gb"
    devices: tuple[AdvertisedDevice, ...]
    sharing: SharingMode = "none"
    replicas: int = 1  # replicas per physical device when shared
    fail_requests_greater_than_one: bool = False

    @cached_property
    def devices_per_physical(self) -> Mapping[str, int]:
        """How many advertised IDs each physical device (GPU or MIG UUID) has here: its replicas, or 1.

        Computed once per plan (a plan is never changed), not on every GetPreferredAllocation call.
        """
        return MappingProxyType(dict(Counter(d.physical_uuid for d in self.devices)))

    @property
    def socket_name(self) -> str:
        """Socket file name in the device-plugin directory, as NVIDIA's plugin names it (nvidia-gpu.sock)."""
        prefix, _, short = self.name.rpartition("/")
        base = short if prefix == "nvidia.com" else self.name.replace("/", "-")
        return f"nvidia-{base}.sock"


def whole_gpu_device(gpu: Gpu) -> AdvertisedDevice:
    """The unshared advertised device for a whole GPU."""
    return AdvertisedDevice(
        id=gpu.uuid,
        kind="gpu",
        physical_uuid=gpu.uuid,
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        mig_index=None,
        replica=None,
        numa_node=gpu.numa_node,
        memory_bytes=gpu.memory_bytes,
    )


def mig_device(gpu: Gpu, mig: MigDevice) -> AdvertisedDevice:
    """The unshared advertised device for a MIG device of `gpu`."""
    return AdvertisedDevice(
        id=mig.uuid,
        kind="mig",
        physical_uuid=mig.uuid,
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        mig_index=mig.index,
        replica=None,
        numa_node=gpu.numa_node,
        memory_bytes=mig.memory_bytes,
    )


def replica_of(dev: AdvertisedDevice, replica: int) -> AdvertisedDevice:
    """Replica `replica` of an unshared advertised device."""
    return replace(dev, id=replica_id(dev.physical_uuid, replica), replica=replica)


def base_resources(
    gpus: Sequence[Gpu], resources: Resources, strategy: MigStrategy
) -> dict[str, list[AdvertisedDevice]]:
    """Each device of `gpus` under its resource name before sharing: resource -> devices, in GPU order."""
    base: dict[str, list[AdvertisedDevice]] = {}
    for gpu in gpus:
        if gpu.mig_enabled and advertises_mig_devices(strategy):
            for mig in sorted(gpu.mig_devices, key=lambda mig: mig.index):
                name = _mig_resource_name(mig.profile, resources.mig, strategy)
                base.setdefault(name, []).append(mig_device(gpu, mig))
        else:
            name = _first_match(resources.gpus, gpu.name) or DEFAULT_GPU_RESOURCE
            base.setdefault(name, []).append(whole_gpu_device(gpu))
    return base


def _mig_resource_name(profile: str, patterns: Sequence[ResourcePattern], strategy: MigStrategy) -> str:
    named = _first_match(patterns, profile)
    if named is not None:
        return named
    return DEFAULT_GPU_RESOURCE if strategy == "single" else default_mig_resource_name(profile)


def _first_match(patterns: Sequence[ResourcePattern], name: str) -> str | None:
    for pattern in patterns:
        if resource_pattern_matches(pattern.pattern, name):
            return pattern.name
    return None


def resource_pattern_matches(pattern: str, name: str) -> bool:
    """NVIDIA's ResourcePattern.Matches (v0.20): `*` is any run of characters, the rest is literal, and the
    pattern must match the whole name ("1g.10gb" does not match "1g.10gb+me"; "A100" does not match
    "NVIDIA A100-SXM4-80GB", "*A100*" does)."""
    return _compiled_pattern(pattern).fullmatch(name) is not None


@lru_cache(maxsize=256)
def _compiled_pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(literal) for literal in pattern.split("*")), re.DOTALL)


def default_mig_resource_name(profile: str) -> str:
    """The `mixed` strategy's resource for a MIG profile: "1g.10gb" -> nvidia.com/mig-1g.10gb.

    "+" is not valid in a resource name, so "1g.10gb+me" -> mig-1g.10gb.me (as NVIDIA names it); a
    compute-instance profile "1c.3g.40gb" goes with its GPU instance, mig-3g.40gb.
    """
    gpu_instance_profile = _COMPUTE_INSTANCE_PREFIX.sub("", profile)
    return f"{RESOURCE_PREFIX}/mig-{gpu_instance_profile.replace('+', '.')}"

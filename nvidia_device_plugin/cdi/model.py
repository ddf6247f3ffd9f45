"""The CDI names Allocate and the specs share, and the values passed between the CDI modules.

The vendor, the device classes (`gpu`, `imex-channel`, and the extra classes `gdrcopy`, `gds`, `mofed`)
and the name a device has (`runtime_device_id`) are decided here, for Allocate (serving/) and the spec
generation alike; then the settings spec generation reads, a mount, a spec, and a plan of specs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from nvidia_device_plugin.base.errors import DevicePluginError
from nvidia_device_plugin.config.v1 import Config, DeviceIdStrategy
from nvidia_device_plugin.plans.resources import AdvertisedDevice

CDI_VENDOR = "k8s.device-plugin.nvidia.com"
GPU_CLASS = "gpu"  # every GPU and MIG device Allocate names, as in NVIDIA's plugin
IMEX_CLASS = "imex-channel"  # one device per IMEX channel, named by its ID ("0"), as in NVIDIA v0.20
# NVIDIA's options for the driver's files (its toolkit's discover.Mount), and for the Vulkan ICD / layer
# files, which it mounts at a container path of its own (/etc/vulkan/...) with a plain bind.
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
CONTAINER_PATH_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")


@dataclass(frozen=True)
class ExtraMode:
    """One of Allocate's extra devices (`<name>Enabled`): a CDI class of its own with one device "all"."""

    name: str  # the CDI class, and the stem of its flag and of its NVIDIA_<NAME> variable
    device_node_globs: tuple[str, ...]  # under /dev: the nodes its device "all" holds
    mounts: tuple[str, ...] = ()  # under the driver root, mounted when they exist and the nodes do


# In the order Allocate names them, after the GPUs (NVIDIA's toolkit: discover/gdrcopy, gds, mofed).
EXTRA_MODES = (
    ExtraMode("gdrcopy", ("gdrdrv",)),
    ExtraMode("gds", ("nvidia-fs*",), mounts=("/run/udev", "/etc/cufile.json")),
    ExtraMode("mofed", ("infiniband/uverbs*", "infiniband/rdma_cm")),
)


class ExtraModeFlags(Protocol):
    """The flags that enable the extra modes (config's Flags and Allocate's settings both carry them)."""

    @property
    def gdrcopy_enabled(self) -> bool: ...
    @property
    def gds_enabled(self) -> bool: ...
    @property
    def mofed_enabled(self) -> bool: ...


def enabled_extra_modes(flags: ExtraModeFlags) -> tuple[str, ...]:
    """The names of the extra modes `flags` enable, in EXTRA_MODES order."""
    enabled = {"gdrcopy": flags.gdrcopy_enabled, "gds": flags.gds_enabled, "mofed": flags.mofed_enabled}
    return tuple(mode.name for mode in EXTRA_MODES if enabled[mode.name])


def extra_mode(name: str) -> ExtraMode:
    return next(mode for mode in EXTRA_MODES if mode.name == name)


def runtime_device_id(device: AdvertisedDevice, strategy: DeviceIdStrategy) -> str:
    """The ID the runtime gets for `device`, and its CDI device name: a UUID, or "3" / "3:1" (index)."""
    return device.physical_uuid if strategy == "uuid" else device.index_id


def cdi_kind(cdi_class: str) -> str:
    return f"{CDI_VENDOR}/{cdi_class}"


def cdi_device_name(cdi_class: str, device: str) -> str:
    """The fully qualified CDI name: "k8s.device-plugin.nvidia.com/gpu=<device>"."""
    return f"{cdi_kind(cdi_class)}={device}"


class CdiError(DevicePluginError):
    """A CDI spec cannot be generated or written; the message says what is missing on the node."""


@dataclass(frozen=True)
class CdiSettings:
    """The config fields CDI spec generation reads (NVIDIA's names in the comments), built by `from_config`
    only: no field has a default of its own, so they cannot drift from the config's (config/v1.py)."""

    device_id_strategy: DeviceIdStrategy
    nvidia_driver_root: str  # nvidiaDriverRoot: the driver root on the host (host paths in the spec)
    container_driver_root: str  # containerDriverRoot: where this process sees it
    nvidia_dev_root: str  # nvidiaDevRoot: the host root of /dev (device nodes' host paths)
    hook_path: str  # nvidiaCTKPath / --nvidia-cdi-hook-path
    disabled_hooks: tuple[str, ...]  # cdiDisableHooks
    feature_flags: tuple[str, ...]  # cdiFeatureFlags
    spec_dir: str  # cdiSpecDir (ours)
    extra_modes: tuple[str, ...]  # the names of the EXTRA_MODES enabled

    @classmethod
    def from_config(cls, config: Config) -> CdiSettings:
        flags = config.flags
        plugin = flags.plugin
        return cls(
            device_id_strategy=plugin.device_id_strategy,
            nvidia_driver_root=flags.nvidia_driver_root,
            container_driver_root=plugin.container_driver_root,
            nvidia_dev_root=flags.nvidia_dev_root,
            hook_path=plugin.nvidia_ctk_path,
            disabled_hooks=plugin.cdi_disable_hooks,
            feature_flags=plugin.cdi_feature_flags,
            spec_dir=plugin.cdi_spec_dir,
            extra_modes=enabled_extra_modes(flags),
        )


@dataclass(frozen=True)
class Mount:
    """One file of the driver root a spec mounts: where it is under the root, where the container sees it."""

    path: str  # under the driver root, absolute ("/usr/share/vulkan/icd.d/nvidia_icd.json")
    container_path: str  # "/etc/vulkan/icd.d/nvidia_icd.json"; most files keep their path
    options: tuple[str, ...] = MOUNT_OPTIONS


@dataclass(frozen=True)
class CdiSpec:
    """One spec file: its name in the spec directory and its JSON document."""

    file_name: str  # "<vendor>-<class>.json", as the CDI library names generated specs
    kind: str  # "<vendor>/<class>"
    document: dict[str, Any]

    @property
    def device_names(self) -> tuple[str, ...]:
        """The fully qualified CDI names this spec defines ("<kind>=<device name>")."""
        return tuple(f"{self.kind}={d['name']}" for d in self.document["devices"])


@dataclass(frozen=True)
class CdiPlan:
    """The specs a snapshot needs, or why they cannot be made (then no CDI resource is served)."""

    spec_dir: str
    specs: tuple[CdiSpec, ...] = ()
    problem: str | None = None  # set: nothing can be served under a CDI strategy
    notes: tuple[str, ...] = ()  # settings accepted but without effect here, for one log line each
    imex_channels: tuple[int, ...] = ()  # the IMEX channels the imex-channel spec defines (Allocate names)
    extra_modes: tuple[str, ...] = ()  # the extra modes whose spec exists (Allocate names `<mode>=all`)

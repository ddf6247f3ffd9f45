"""Values shared by the CDI modules: the settings spec generation reads, a spec, and a plan of specs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nvidia_device_plugin.config.v1 import Config, DeviceIdStrategy
from nvidia_device_plugin.errors import DevicePluginError

CDI_VENDOR = "k8s.device-plugin.nvidia.com"
# The lowest CDI version with every field the specs use (deviceNodes[].hostPath arrived in 0.5.0); the
# CDI library refuses a spec whose version is below what its fields need, and old runtimes refuse newer ones.
CDI_VERSION = "0.5.0"
# Allocate's extra devices (gdrcopyEnabled, gdsEnabled, mofedEnabled): one class each, one device "all".
EXTRA_MODES = ("gdrcopy", "gds", "mofed")


class CdiError(DevicePluginError):
    """A CDI spec cannot be generated or written; the message says what is missing on the node."""


@dataclass(frozen=True)
class CdiSettings:
    """The config fields CDI spec generation reads (NVIDIA's names in the comments)."""

    device_id_strategy: DeviceIdStrategy = "uuid"
    nvidia_driver_root: str = "/"  # nvidiaDriverRoot: the driver root on the host (host paths in the spec)
    container_driver_root: str = "/driver-root"  # containerDriverRoot: where this process sees it
    nvidia_dev_root: str = "/"  # nvidiaDevRoot: the host root of /dev (device nodes' host paths)
    hook_path: str = "/usr/bin/nvidia-ctk"  # nvidiaCTKPath / --nvidia-cdi-hook-path
    disabled_hooks: tuple[str, ...] = ()  # cdiDisableHooks
    feature_flags: tuple[str, ...] = ()  # cdiFeatureFlags
    spec_dir: str = "/var/run/cdi"  # cdiSpecDir (ours)
    extra_modes: tuple[str, ...] = ()  # of EXTRA_MODES, those enabled

    @classmethod
    def from_config(cls, config: Config) -> CdiSettings:
        flags = config.flags
        plugin = flags.plugin
        enabled = {"gdrcopy": flags.gdrcopy_enabled, "gds": flags.gds_enabled, "mofed": flags.mofed_enabled}
        return cls(
            device_id_strategy=plugin.device_id_strategy,
            nvidia_driver_root=flags.nvidia_driver_root,
            container_driver_root=plugin.container_driver_root,
            nvidia_dev_root=flags.nvidia_dev_root,
            hook_path=plugin.nvidia_ctk_path,
            disabled_hooks=plugin.cdi_disable_hooks,
            feature_flags=plugin.cdi_feature_flags,
            spec_dir=plugin.cdi_spec_dir,
            extra_modes=tuple(m for m in EXTRA_MODES if enabled[m]),
        )


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

"""Every setting a CLI flag or an environment variable may set, under NVIDIA's names.

The flag and environment-variable names are NVIDIA's (cmd/nvidia-device-plugin/main.go), so a DaemonSet
written for NVIDIA's plugin configures this one the same way; where NVIDIA lists several environment
variables for one flag, the first one set wins. The config-source options (`SOURCE_OPTIONS`) choose the
file; `--config-dir`, `--config-name`, `--config-default` and `--config-fallback-strategies` are this
plugin's own (NVIDIA does that job with a config-manager sidecar that copies the chosen file).
config.flags turns them into a Config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OptionKind = Literal["str", "bool", "list", "ints"]


@dataclass(frozen=True)
class ConfigOption:
    """One config setting that a CLI flag or an environment variable may also set."""

    path: str  # where it lives in the config document, e.g. "flags.plugin.passDeviceSpecs"
    flags: tuple[str, ...]  # argparse option strings; the first names it in errors
    env: tuple[str, ...]  # environment variables, first set wins
    kind: OptionKind
    help: str

    @property
    def dest(self) -> str:
        return self.flags[0].removeprefix("--").replace("-", "_")


CONFIG_OPTIONS: tuple[ConfigOption, ...] = (
    ConfigOption(
        "flags.migStrategy",
        ("--mig-strategy",),
        ("MIG_STRATEGY",),
        "str",
        "how MIG devices are advertised: none, single or mixed",
    ),
    ConfigOption(
        "flags.failOnInitError",
        ("--fail-on-init-error",),
        ("FAIL_ON_INIT_ERROR",),
        "bool",
        "exit when initialisation fails instead of waiting forever",
    ),
    ConfigOption(
        "flags.nvidiaDriverRoot",
        ("--nvidia-driver-root", "--driver-root"),
        ("NVIDIA_DRIVER_ROOT",),
        "str",
        "root of the NVIDIA driver installation on the host ('/' or '/run/nvidia/driver')",
    ),
    ConfigOption(
        "flags.nvidiaDevRoot",
        ("--nvidia-dev-root", "--dev-root"),
        ("NVIDIA_DEV_ROOT",),
        "str",
        "root of the NVIDIA device nodes on the host (default: the driver root)",
    ),
    ConfigOption(
        "flags.mpsRoot",
        ("--mps-root",),
        ("MPS_ROOT",),
        "str",
        "host directory where the MPS control daemons keep their pipes and logs",
    ),
    ConfigOption(
        "flags.gdsEnabled",
        ("--gds-enabled",),
        ("GDS_ENABLED",),
        "bool",
        "start containers with GPUDirect Storage",
    ),
    ConfigOption(
        "flags.mofedEnabled", ("--mofed-enabled",), ("MOFED_ENABLED",), "bool", "start containers with MOFED"
    ),
    ConfigOption(
        "flags.gdrcopyEnabled",
        ("--gdrcopy-enabled",),
        ("GDRCOPY_ENABLED",),
        "bool",
        "start containers with GDRCopy",
    ),
    ConfigOption(
        "flags.deviceDiscoveryStrategy",
        ("--device-discovery-strategy",),
        ("DEVICE_DISCOVERY_STRATEGY",),
        "str",
        "auto, nvml or tegra (discovery always uses NVML; tegra is logged as unsupported)",
    ),
    ConfigOption(
        "flags.resourceNaming",
        ("--resource-naming",),
        ("NVDP_RESOURCE_NAMING",),
        "bool",
        "ours: apply the config's resources renames and sharing rename/devices, which NVIDIA v0.20 ignores "
        "with a warning (and so does this plugin without this option)",
    ),
    ConfigOption(
        "flags.plugin.passDeviceSpecs",
        ("--pass-device-specs",),
        ("PASS_DEVICE_SPECS",),
        "bool",
        "pass device node specs to kubelet on Allocate (for the static CPU manager)",
    ),
    ConfigOption(
        "flags.plugin.deviceListStrategy",
        ("--device-list-strategy",),
        ("DEVICE_LIST_STRATEGY",),
        "list",
        "how containers get their devices: envvar, volume-mounts, cdi-annotations, cdi-cri (comma-separated)",
    ),
    ConfigOption(
        "flags.plugin.deviceIDStrategy",
        ("--device-id-strategy",),
        ("DEVICE_ID_STRATEGY",),
        "str",
        "how devices are named to the container runtime: uuid or index",
    ),
    ConfigOption(
        "flags.plugin.sharedDevicesAllocationPolicy",
        ("--shared-devices-allocation-policy",),
        ("SHARED_DEVICES_ALLOCATION_POLICY",),
        "str",
        "how replicas of shared GPUs are picked: distributed (spread) or packed (fill GPUs)",
    ),
    ConfigOption(
        "flags.plugin.cdiAnnotationPrefix",
        ("--cdi-annotation-prefix",),
        ("CDI_ANNOTATION_PREFIX",),
        "str",
        "prefix of CDI annotation keys",
    ),
    ConfigOption(
        "flags.plugin.nvidiaCTKPath",
        ("--nvidia-cdi-hook-path", "--nvidia-ctk-path"),
        ("NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"),
        "str",
        "host path of the NVIDIA CDI hook (nvidia-ctk or nvidia-cdi-hook) that CDI specs run; "
        "GPU Operator nodes: /usr/local/nvidia/toolkit/nvidia-ctk",
    ),
    ConfigOption(
        "flags.plugin.containerDriverRoot",
        ("--container-driver-root", "--driver-root-ctr-path"),
        ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"),
        "str",
        "where the driver root is mounted inside this container (for CDI specs)",
    ),
    ConfigOption(
        "flags.plugin.cdiFeatureFlags",
        ("--cdi-feature-flags",),
        ("CDI_FEATURE_FLAGS",),
        "list",
        "feature flags for CDI spec generation (comma-separated)",
    ),
    ConfigOption(
        "flags.plugin.cdiDisableHooks",
        ("--cdi-disable-hooks",),
        ("CDI_DISABLE_HOOKS",),
        "list",
        "CDI hooks to leave out of generated CDI specs (comma-separated)",
    ),
    ConfigOption(
        "flags.plugin.cdiSpecDir",
        ("--cdi-spec-dir",),
        ("CDI_SPEC_DIR",),
        "str",
        "directory where generated CDI specs are written (default /var/run/cdi)",
    ),
    ConfigOption(
        "imex.channelIDs",
        ("--imex-channel-ids",),
        ("IMEX_CHANNEL_IDS",),
        "ints",
        "IMEX channels to inject into every container (only 0 is valid)",
    ),
    ConfigOption(
        "dra.enabled",
        ("--dra",),
        ("NVDP_DRA",),
        "bool",
        "also serve DRA (resource.k8s.io/v1: ResourceSlices, the kubelet DRA plugin) for the GPUs DRA owns",
    ),
    ConfigOption(
        "dra.gpus",
        ("--dra-gpus",),
        ("NVDP_DRA_GPUS",),
        "list",
        "the GPUs DRA owns when it is on: all, or GPU indices / UUIDs (comma-separated)",
    ),
    ConfigOption(
        "dra.dynamicMig",
        ("--dra-dynamic-mig",),
        ("NVDP_DRA_DYNAMIC_MIG",),
        "bool",
        "DRA-owned GPUs in MIG mode publish every possible MIG placement (dynamic MIG, KEP-4815 counters)",
    ),
    ConfigOption(
        "imex.required",
        ("--imex-required",),
        ("IMEX_REQUIRED",),
        "bool",
        "refuse to serve when an IMEX channel's device node is missing",
    ),
)

# Config-source options: (dest, flag, env).
SOURCE_OPTIONS = (
    ("config_file", "--config-file", "CONFIG_FILE"),
    ("config_dir", "--config-dir", "NVDP_CONFIG_DIR"),
    ("config_name", "--config-name", "NVDP_CONFIG_NAME"),
    ("config_default", "--config-default", "NVDP_CONFIG_DEFAULT"),
    ("config_fallback_strategies", "--config-fallback-strategies", "NVDP_CONFIG_FALLBACK_STRATEGIES"),
)
SOURCE_HELP = {
    "config_file": "the config file (YAML or JSON, NVIDIA's version: v1 format)",
    "config_dir": "a directory of named configs (a ConfigMap mounted whole); pick one with --config-name",
    "config_name": "which file in --config-dir to use (e.g. the node's nvidia.com/device-plugin.config)",
    "config_default": "the file in --config-dir to use when --config-name is unset or does not exist",
    "config_fallback_strategies": "without --config-name and --config-default, how to choose a file in "
    "--config-dir: NVIDIA's named (the key 'default'), single (the only key), empty (built-in defaults), "
    "comma-separated, tried in order (default named,single)",
}

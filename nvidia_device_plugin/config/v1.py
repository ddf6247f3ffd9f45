"""Types of the `version: v1` config format (NVIDIA k8s-device-plugin's), with their defaults.

Plain frozen values, which refuse what no config may hold: the sharing types check their replica counts
and device selections when they are built (`InvalidValue`), whether the loader builds them from a
document or a caller builds them by hand. Every mode and strategy is a Literal type, and its tuple of
allowed values is derived from that type, so the loader's check and mypy's agree. Reading a document
(keys, types, resource names) is the job of config.sections and config.resource_sections. Code
downstream trusts these values and checks nothing of them; it checks only how they meet the node (device
refs that do not resolve there, say).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.dra import Dra

VERSION = "v1"
RESOURCE_PREFIX = "nvidia.com"
SHARED_SUFFIX = ".shared"

MigStrategy = Literal["none", "single", "mixed"]
DeviceListStrategy = Literal["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"]
# Several strategies may be combined; at least one is always given.
DeviceListStrategies = tuple[DeviceListStrategy, *tuple[DeviceListStrategy, ...]]
DeviceIdStrategy = Literal["uuid", "index"]
# NVIDIA's flags.deviceDiscoveryStrategy. Discovery is always NVML here: `tegra` is accepted, and the daemon
# says at start that it is not supported and NVML is used.
DeviceDiscoveryStrategy = Literal["auto", "nvml", "tegra"]
# NVIDIA's flags.plugin.sharedDevicesAllocationPolicy: how replicas of shared GPUs are picked (see serving).
SharedAllocationPolicy = Literal["distributed", "packed"]
# What a ConfigWarning is about: a key the schema does not know (the daemon ignores it, check-config refuses
# it), a known key spelt in another case (accepted, as NVIDIA accepts it), or a setting NVIDIA v0.20 ignores
# and so do we unless told otherwise (resource naming: config.naming).
ConfigWarningKind = Literal["unknown-key", "key-case", "ignored"]
# How the file served was chosen (config.source): a file named by --config-file / CONFIG_FILE, the
# --config-name or --config-default file of a config directory, one of NVIDIA's fallback strategies, the
# node's label (the in-process config-manager), or no file at all (built-in defaults).
ConfigChoice = Literal[
    "config-file",
    "config-name",
    "config-default",
    "fallback-named",
    "fallback-single",
    "fallback-empty",
    "node-label",
    "defaults",
]
# How a resource's devices are shared, as NVIDIA's plugin decides it from the sharing section.
SharingMode = Literal["none", "time-slicing", "mps"]
# NVML event types a health check may watch (NVIDIA's health.eventTypes names).
HealthEventType = Literal[
    "EventTypeXidCriticalError", "EventTypeDoubleBitEccError", "EventTypeSingleBitEccError"
]

MIG_STRATEGIES: Final[tuple[MigStrategy, ...]] = get_args(MigStrategy)
DEVICE_LIST_STRATEGIES: Final[tuple[DeviceListStrategy, ...]] = get_args(DeviceListStrategy)
# The strategies that answer Allocate with CDI names (any_cdi_enabled / all_cdi_enabled read them).
CDI_DEVICE_LIST_STRATEGIES: Final[frozenset[DeviceListStrategy]] = frozenset({"cdi-annotations", "cdi-cri"})
DEVICE_ID_STRATEGIES: Final[tuple[DeviceIdStrategy, ...]] = get_args(DeviceIdStrategy)
DEVICE_DISCOVERY_STRATEGIES: Final[tuple[DeviceDiscoveryStrategy, ...]] = get_args(DeviceDiscoveryStrategy)
SHARED_ALLOCATION_POLICIES: Final[tuple[SharedAllocationPolicy, ...]] = get_args(SharedAllocationPolicy)
SHARING_MODES: Final[tuple[SharingMode, ...]] = get_args(SharingMode)
# All three are watched by default.
HEALTH_EVENT_TYPES: Final[tuple[HealthEventType, ...]] = get_args(HealthEventType)

DEFAULT_CDI_SPEC_DIR = "/var/run/cdi"
# NVIDIA sets no limit; a typo like 100000 would make us advertise millions of device IDs, so we refuse it.
MAX_REPLICAS = 4096

# Application-level XIDs that do not mean the GPU is broken (NVIDIA's plugin skips the same ones).
DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})


def advertises_mig_devices(strategy: MigStrategy) -> bool:
    """Whether a MIG-enabled GPU is advertised as its MIG devices (single, mixed) rather than whole (none)."""
    return strategy != "none"


class InvalidValue(ConfigError):
    """A value a v1 type refuses: the sentence names the field relative to the refusing value.

    `field` is that field ("replicas", "resources[1].replicas") and `problem` the rest of the sentence,
    where "{at}" stands for the refusing value's own place. Built by hand, the message reads "replicas
    must be >= 1, got 0"; the loader reports it where the value is in the document (`located`).
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(self.located("")[1])

    def located(self, owner: str) -> tuple[str, str]:
        """(the field's document path, the whole sentence) for a value found at `owner`."""
        at = f"{owner}." if owner else ""
        return at + self.field, at + self.field + self.problem.replace("{at}", at)


def shown_int(value: int) -> str:
    """An integer as error messages show it: up to 40 digits, else its first 20 and "..."."""
    try:
        text = repr(value)
    except ValueError:  # beyond Python's digit limit
        return "a very large integer"
    return text if len(text) <= 40 else text[:20] + "..."


def any_cdi_enabled(strategies: Sequence[DeviceListStrategy]) -> bool:
    """Whether any device-list strategy is a CDI one (NVIDIA's AnyCDIEnabled): Allocate names CDI devices,
    so their specs must exist."""
    return any(s in CDI_DEVICE_LIST_STRATEGIES for s in strategies)


def all_cdi_enabled(strategies: Sequence[DeviceListStrategy]) -> bool:
    """Whether every device-list strategy is a CDI one (NVIDIA's AllCDIEnabled): the CDI spec then sets
    NVIDIA_VISIBLE_DEVICES and the device nodes, and Allocate passes neither."""
    return all(s in CDI_DEVICE_LIST_STRATEGIES for s in strategies)


@dataclass(frozen=True)
class PluginFlags:
    """NVIDIA's `flags.plugin`: how Allocate hands devices to a container."""

    pass_device_specs: bool = False
    device_list_strategy: DeviceListStrategies = ("envvar",)
    device_id_strategy: DeviceIdStrategy = "uuid"
    shared_devices_allocation_policy: SharedAllocationPolicy = "distributed"
    # The CDI settings below are carried for the CDI spec generator; Allocate only names CDI devices.
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    nvidia_ctk_path: str = "/usr/bin/nvidia-ctk"  # NVIDIA's nvidiaCTKPath / --nvidia-cdi-hook-path
    container_driver_root: str = "/driver-root"
    cdi_feature_flags: tuple[str, ...] = ()  # NVIDIA's --cdi-feature-flags, passed to spec generation
    cdi_disable_hooks: tuple[str, ...] = ()  # NVIDIA's --cdi-disable-hooks: hooks left out of the spec
    cdi_spec_dir: str = DEFAULT_CDI_SPEC_DIR  # ours: where generated CDI specs are written


@dataclass(frozen=True)
class Flags:
    """NVIDIA's `flags`: MIG strategy, driver roots and the other node-wide settings."""

    mig_strategy: MigStrategy = "none"
    fail_on_init_error: bool = True
    nvidia_driver_root: str = "/"
    nvidia_dev_root: str = "/"
    mps_root: str = "/run/nvidia/mps"
    gds_enabled: bool = False
    mofed_enabled: bool = False
    gdrcopy_enabled: bool = False
    device_discovery_strategy: DeviceDiscoveryStrategy = "auto"
    # Ours: apply `resources` renames and sharing `rename`/`devices`. False is NVIDIA v0.20's behaviour
    # (DisableResourceNamingInConfig: ignored, with its warnings), so a v0.20 ConfigMap advertises the
    # same names and counts here (config.naming).
    resource_naming: bool = False
    plugin: PluginFlags = field(default_factory=PluginFlags)


@dataclass(frozen=True)
class ResourcePattern:
    """Advertise devices whose name (GPU product name, or MIG profile) matches `pattern` as `name`."""

    pattern: str
    name: str  # fully qualified, e.g. "nvidia.com/a100"


@dataclass(frozen=True)
class Resources:
    """NVIDIA's `resources`: renames of GPUs and MIG devices by product pattern."""

    gpus: tuple[ResourcePattern, ...] = ()
    mig: tuple[ResourcePattern, ...] = ()


@dataclass(frozen=True)
class ReplicatedDevices:
    """Which devices a sharing entry applies to: all of them, the first `count`, or explicit refs."""

    all: bool = True
    count: int | None = None
    refs: tuple[str, ...] = ()  # GPU index "0", MIG index "0:1", GPU UUID or MIG UUID

    def __post_init__(self) -> None:
        # The refs are used if any, else the count, else `all` (see resource_plans.py).
        if self.refs:
            return
        if self.count is not None and self.count < 1:
            raise InvalidValue("devices", f": a device count must be > 0, got {self.count}")
        if self.count is None and not self.all:
            raise InvalidValue("devices", ": the device list is empty (use 'all' to share every device)")


@dataclass(frozen=True)
class ReplicatedResource:
    """One resource shared out in `replicas` (time-slicing or MPS), optionally renamed."""

    name: str  # fully qualified resource being shared, e.g. "nvidia.com/gpu"
    replicas: int
    rename: str | None = None  # fully qualified; None keeps `name`
    devices: ReplicatedDevices = field(default_factory=ReplicatedDevices)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise InvalidValue("replicas", f" must be >= 1, got {self.replicas}")
        if self.replicas > MAX_REPLICAS:
            raise InvalidValue(
                "replicas",
                f": at most {MAX_REPLICAS} replicas per device (each is a device for kubelet to track), "
                f"got {shown_int(self.replicas)}",
            )


@dataclass(frozen=True)
class ReplicatedResources:
    """A sharing section (`timeSlicing` or `mps`): its resources and their options."""

    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    resources: tuple[ReplicatedResource, ...] = ()

    def __post_init__(self) -> None:
        # One advertised name is one resource with one replica count; NVIDIA would merge two counts
        # into a resource the plan cannot describe.
        first: dict[str, int] = {}  # advertised name -> the first entry advertised under it
        for i, entry in enumerate(self.resources):
            name = self.advertised_name(entry)
            other = self.resources[first.setdefault(name, i)]
            if other.replicas != entry.replicas:
                raise InvalidValue(
                    f"resources[{i}].replicas",
                    f": {name!r} is also advertised by {{at}}resources[{first[name]}] with "
                    f"{other.replicas} replicas; entries advertised under one name need one replica count, "
                    f"got {entry.replicas}",
                )

    def advertised_name(self, entry: ReplicatedResource) -> str:
        """The name `entry`'s replicas are advertised under: its rename, or <name>.shared with
        renameByDefault, or its own name."""
        if entry.rename:
            return entry.rename
        return entry.name + SHARED_SUFFIX if self.rename_by_default else entry.name


@dataclass(frozen=True)
class Sharing:
    """NVIDIA's `sharing`: time-slicing and, when set, MPS."""

    time_slicing: ReplicatedResources = field(default_factory=ReplicatedResources)
    mps: ReplicatedResources | None = None

    @property
    def strategy(self) -> SharingMode:
        """'mps', 'time-slicing' or 'none', as NVIDIA's plugin decides it (MPS wins when both are set)."""
        if self.mps is not None and self.mps.resources:
            return "mps"
        if self.time_slicing.resources:
            return "time-slicing"
        return "none"

    @property
    def active(self) -> ReplicatedResources:
        return self.mps if self.strategy == "mps" and self.mps is not None else self.time_slicing


@dataclass(frozen=True)
class Recovery:
    """Bringing an unhealthy device back; off by default, as a false positive is rarer than a bad GPU."""

    enabled: bool = False
    grace_period_seconds: float = 300.0


@dataclass(frozen=True)
class Health:
    """The `health` section: which events make a device unhealthy, and recovery."""

    disabled: bool = False
    event_types: tuple[HealthEventType, ...] = HEALTH_EVENT_TYPES
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    critical_xids: frozenset[int] | None = None  # None: every XID not ignored is critical
    recovery: Recovery = field(default_factory=Recovery)

    def is_critical(self, xid: int) -> bool:
        if self.disabled or xid in self.ignored_xids:
            return False
        return self.critical_xids is None or xid in self.critical_xids


@dataclass(frozen=True)
class Imex:
    """NVIDIA's `imex` section: the IMEX channels (/dev/nvidia-caps-imex-channels/channel<N>) every
    container gets; with `required`, the plugin refuses to serve when a channel's device node is missing."""

    channel_ids: tuple[int, ...] = ()
    required: bool = False


@dataclass(frozen=True)
class ConfigWarning:
    """Something in the document that was accepted but deserves an operator's eye."""

    kind: ConfigWarningKind
    path: str  # the key as written, e.g. "flags.plugin.passDeviceSpec"
    message: str  # the complete sentence, starting with the path


@dataclass(frozen=True)
class ConfigOrigin:
    """Where a loaded config came from, for the start-up and reload log lines and the active-config metric."""

    file: str  # the file read ("" when none was: the built-in defaults)
    choice: ConfigChoice
    why: str  # the sentence for the log, e.g. "--config-name 'a100' in /config"


@dataclass(frozen=True)
class Config:
    """A whole `version: v1` config, after defaults, environment and flags."""

    version: str = VERSION
    flags: Flags = field(default_factory=Flags)
    resources: Resources = field(default_factory=Resources)
    sharing: Sharing = field(default_factory=Sharing)
    health: Health = field(default_factory=Health)
    imex: Imex = field(default_factory=Imex)
    dra: Dra = field(default_factory=Dra)  # ours (config/dra.py): DRA beside the device plugin
    # What the loader accepted with a warning; not part of the config's meaning, so not compared.
    warnings: tuple[ConfigWarning, ...] = field(default=(), compare=False)
    # Where it was read from (config.source sets it); None for a Config built in code.
    origin: ConfigOrigin | None = field(default=None, compare=False)

    @property
    def unknown_keys(self) -> tuple[str, ...]:
        return tuple(w.path for w in self.warnings if w.kind == "unknown-key")

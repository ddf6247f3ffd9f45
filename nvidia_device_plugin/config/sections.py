"""A v1 document -> the frozen types of config.v1: the flags, health and imex sections here, the sections
that name resources (resources, sharing) in config.resource_sections.

Each `_parse_*` function takes one `Section` and returns its v1 value, raising `Invalid` with the path of
the first problem: a key, type or value the document may not hold. The v1 types refuse the values no
config may hold, however it is built; code that receives a `Config` trusts it and checks nothing of it
(its modes and strategies are Literal types, so mypy holds callers to them).

Deliberate departures from NVIDIA's behaviour are listed in config.loader.
"""

from __future__ import annotations

import math

from nvidia_device_plugin.config.document import Problems, check_version, fail, fail_type, show
from nvidia_device_plugin.config.dra import Dra
from nvidia_device_plugin.config.dra_section import DRA_FIELDS, parse_dra
from nvidia_device_plugin.config.durations import parse_go_duration
from nvidia_device_plugin.config.naming import drop_resource_naming
from nvidia_device_plugin.config.resource_sections import parse_resources, parse_sharing
from nvidia_device_plugin.config.schema import (
    FLAG_FIELDS,
    GFD_FIELDS,
    HEALTH_FIELDS,
    IMEX_FIELDS,
    PLUGIN_FIELDS,
    RECOVERY_FIELDS,
    RESOURCES_FIELDS,
    SHARING_FIELDS,
    TOP_FIELDS,
    KeyNotes,
    Section,
    choose,
)
from nvidia_device_plugin.config.v1 import (
    DEVICE_DISCOVERY_STRATEGIES,
    DEVICE_ID_STRATEGIES,
    DEVICE_LIST_STRATEGIES,
    HEALTH_EVENT_TYPES,
    MIG_STRATEGIES,
    RESOURCE_PREFIX,
    SHARED_ALLOCATION_POLICIES,
    VERSION,
    Config,
    DeviceListStrategies,
    DeviceListStrategy,
    Flags,
    Health,
    HealthEventType,
    Imex,
    PluginFlags,
    Recovery,
    Resources,
    Sharing,
)

IMEX_CHANNEL_CONFIGS = ((), (0,))

_MAX_XID = 2**64 - 1


# ---------------------------------------------------------------------------------------------------------
# The document


def parse_document(raw: object, notes: KeyNotes | None = None) -> Config:
    """The Config `raw` describes; `notes` says how unknown keys are judged and collects the warnings.

    Each section is read even when an earlier one has a problem, so that one reading reports every mistake
    it finds (`Problems`, in document order), not just the first.
    """
    notes = notes if notes is not None else KeyNotes()
    doc = Section(raw, "", TOP_FIELDS, notes)
    notes.attempt(None, check_version, doc.raw("version"))
    flags = notes.attempt(Flags(), _parse_flags, doc.section("flags", FLAG_FIELDS))
    resources = notes.attempt(Resources(), parse_resources, doc.section("resources", RESOURCES_FIELDS))
    sharing = notes.attempt(Sharing(), parse_sharing, doc.section("sharing", SHARING_FIELDS))
    health = notes.attempt(Health(), _parse_health, doc.section("health", HEALTH_FIELDS))
    imex = notes.attempt(Imex(), _parse_imex, doc.section("imex", IMEX_FIELDS))
    dra = notes.attempt(Dra(), parse_dra, doc.section("dra", DRA_FIELDS))
    if not flags.resource_naming:
        resources, sharing = notes.attempt(
            (Resources(), sharing), drop_resource_naming, resources, sharing, notes
        )
    notes.attempt(None, _check_sharing_against_flags, sharing, flags)
    if problems := notes.reported():
        raise Problems(problems)
    return Config(
        version=VERSION,
        flags=flags,
        resources=resources,
        sharing=sharing,
        health=health,
        imex=imex,
        dra=dra,
        warnings=tuple(notes.warnings),
    )


def _host_path(s: Section, key: str, default: str) -> str:
    """A path setting that names a host (or container) path: it must be absolute.

    A relative one would be resolved against whatever the working directory is, and some of these are
    handed to kubelet as mount sources (mpsRoot), where a relative path means nothing.
    """
    value = s.get_str(key, default)
    if value and not value.startswith("/"):
        fail(s.path_of(key), f"must be an absolute path, got {value!r}")
    return value


def _parse_flags(s: Section) -> Flags:
    d = Flags()
    driver_root = _host_path(s, "nvidiaDriverRoot", d.nvidia_driver_root)
    # As NVIDIA does: the device nodes live under the driver root unless told otherwise.
    dev_root = _host_path(s, "nvidiaDevRoot", "") or driver_root
    s.get_bool("useNodeFeatureAPI", False)  # GFD only
    # Older NVIDIA releases restarted the plugin on an unhealthy device; health changes are pushed
    # over ListAndWatch here, so the flag is accepted (old ConfigMaps load) and has nothing to do.
    s.get_bool("restartOnDeviceUnhealthy", False)
    prefix = s.get_str("resourceNamePrefix", RESOURCE_PREFIX)
    if prefix not in ("", RESOURCE_PREFIX):
        fail(s.path_of("resourceNamePrefix"), f"only {RESOURCE_PREFIX!r} is supported, got {prefix!r}")
    _check_gfd_flags(s.section("gfd", GFD_FIELDS))
    return Flags(
        mig_strategy=s.get_choice("migStrategy", MIG_STRATEGIES, d.mig_strategy),
        fail_on_init_error=s.get_bool("failOnInitError", d.fail_on_init_error),
        nvidia_driver_root=driver_root,
        nvidia_dev_root=dev_root,
        mps_root=_host_path(s, "mpsRoot", d.mps_root),
        gds_enabled=s.get_bool("gdsEnabled", d.gds_enabled),
        mofed_enabled=s.get_bool("mofedEnabled", d.mofed_enabled),
        gdrcopy_enabled=s.get_bool("gdrcopyEnabled", d.gdrcopy_enabled),
        # Discovery is always NVML here; the daemon says so at start when `tegra` is asked for.
        device_discovery_strategy=s.get_choice(
            "deviceDiscoveryStrategy", DEVICE_DISCOVERY_STRATEGIES, d.device_discovery_strategy
        ),
        resource_naming=s.get_bool("resourceNaming", d.resource_naming),
        plugin=_parse_plugin_flags(s.section("plugin", PLUGIN_FIELDS)),
    )


def _parse_plugin_flags(s: Section) -> PluginFlags:
    d = PluginFlags()
    ctk_path = s.optional_str("nvidiaCTKPath")
    hook_path = s.optional_str("nvidiaCDIHookPath")
    if ctk_path is not None and hook_path is not None and ctk_path != hook_path:
        fail(
            s.path_of("nvidiaCDIHookPath"),
            f"{hook_path!r} contradicts {s.path_of('nvidiaCTKPath')} {ctk_path!r} (one setting; give one)",
        )
    s.optional_str("kubeletSocket")  # the socket is a command-line matter here
    cdi_spec_dir = _host_path(s, "cdiSpecDir", d.cdi_spec_dir) or d.cdi_spec_dir
    return PluginFlags(
        pass_device_specs=s.get_bool("passDeviceSpecs", d.pass_device_specs),
        device_list_strategy=_device_list_strategy(s, d.device_list_strategy),
        device_id_strategy=s.get_choice("deviceIDStrategy", DEVICE_ID_STRATEGIES, d.device_id_strategy),
        shared_devices_allocation_policy=s.get_choice(
            "sharedDevicesAllocationPolicy", SHARED_ALLOCATION_POLICIES, d.shared_devices_allocation_policy
        ),
        cdi_annotation_prefix=s.get_str("cdiAnnotationPrefix", d.cdi_annotation_prefix),
        nvidia_ctk_path=ctk_path or hook_path or d.nvidia_ctk_path,
        container_driver_root=_host_path(s, "containerDriverRoot", d.container_driver_root),
        cdi_feature_flags=_words(s.raw("cdiFeatureFlags"), s.path_of("cdiFeatureFlags")),
        cdi_disable_hooks=_words(s.raw("cdiDisableHooks"), s.path_of("cdiDisableHooks")),
        cdi_spec_dir=cdi_spec_dir,
    )


def _words(value: object, path: str) -> tuple[str, ...]:
    """A list of names given as a YAML list or one comma-separated string (as NVIDIA's string slices)."""
    items = value.split(",") if isinstance(value, str) else _string_list(value, path)
    return tuple(dict.fromkeys(w.strip() for w in items if w.strip()))


def _device_list_strategy(s: Section, default: DeviceListStrategies) -> DeviceListStrategies:
    key = "deviceListStrategy"
    value = s.raw(key)
    path = s.path_of(key)
    if value is None:
        return default
    if isinstance(value, str):
        items: list[tuple[str, object]] = [(path, value)]
    elif isinstance(value, list):
        items = [(f"{path}[{i}]", item) for i, item in enumerate(value)]
    else:
        fail_type(path, "a string or a list of strings", value)
    strategies: list[DeviceListStrategy] = []
    for item_path, item in items:
        hint = " (write several strategies as a YAML list)" if isinstance(item, str) and "," in item else ""
        strategies.append(choose(item_path, item, DEVICE_LIST_STRATEGIES, hint))
    if not strategies:
        fail(path, f"name at least one strategy ({', '.join(DEVICE_LIST_STRATEGIES)})")
    first, *rest = dict.fromkeys(strategies)  # in order, each once
    return (first, *rest)


def _check_gfd_flags(s: Section) -> None:
    for key in ("oneshot", "noTimestamp", "noCleanupOnExit"):
        s.get_bool(key, False)
    for key in ("outputFile", "machineTypeFile"):
        s.optional_str(key)
    interval = s.raw("sleepInterval")
    expected = "a duration such as '60s' or '1m30s', a number of nanoseconds, or 'infinite'"
    if interval is None:
        return
    # GFD only: a number is nanoseconds for NVIDIA's Go Duration, `infinite` labels once and sleeps.
    if isinstance(interval, bool) or not isinstance(interval, (int, float, str)):
        fail_type(s.path_of("sleepInterval"), expected, interval)
    if isinstance(interval, str) and interval != "infinite" and parse_go_duration(interval) is None:
        fail_type(s.path_of("sleepInterval"), expected, interval)


# ---------------------------------------------------------------------------------------------------------
# Across sections


def _check_sharing_against_flags(sharing: Sharing, flags: Flags) -> None:
    # NVIDIA refuses the same two combinations at start-up.
    if sharing.strategy != "mps":
        return
    if flags.mig_strategy == "mixed":
        fail("flags.migStrategy", "'mixed' cannot be combined with sharing.mps (MPS shares whole GPUs only)")
    if not flags.mps_root:
        fail("flags.mpsRoot", "must not be empty when sharing.mps is configured")


# ---------------------------------------------------------------------------------------------------------
# Health and IMEX


def _parse_health(s: Section) -> Health:
    d = Health()
    event_types: list[HealthEventType] = [
        choose(f"{s.path_of('eventTypes')}[{i}]", name, HEALTH_EVENT_TYPES)
        for i, name in enumerate(_string_list(s.raw("eventTypes"), s.path_of("eventTypes")))
    ]
    ignored = _xid_list(s.raw("ignoredXIDs"), s.path_of("ignoredXIDs"))
    critical_raw = s.raw("criticalXIDs")
    critical_path = s.path_of("criticalXIDs")
    critical: frozenset[int] | None = None
    if isinstance(critical_raw, str):
        if critical_raw.lower() != "all":
            fail_type(critical_path, "'all' or a list of XIDs", critical_raw)
    elif critical_raw is not None:
        if not isinstance(critical_raw, list):
            fail_type(critical_path, "'all' or a list of XIDs", critical_raw)
        critical_list = _xid_list(critical_raw, critical_path)
        conflicts = sorted(set(critical_list) & set(ignored))
        if conflicts:
            fail(critical_path, f"XID {conflicts[0]} is also in {s.path_of('ignoredXIDs')}; pick one list")
        critical = frozenset(critical_list)
    return Health(
        disabled=s.get_bool("disabled", d.disabled),
        event_types=tuple(dict.fromkeys(event_types)) or d.event_types,
        ignored_xids=frozenset(ignored) or d.ignored_xids,
        critical_xids=critical,
        recovery=_parse_recovery(s.section("recovery", RECOVERY_FIELDS)),
    )


def _parse_recovery(s: Section) -> Recovery:
    d = Recovery()
    return Recovery(
        enabled=s.get_bool("enabled", d.enabled),
        grace_period_seconds=_seconds(s.raw("gracePeriod"), s.path_of("gracePeriod"), d.grace_period_seconds),
    )


def _seconds(value: object, path: str, default: float) -> float:
    """A number of seconds, or a Go duration string ("5m"); >= 0."""
    expected = "a number of seconds or a duration such as '5m'"
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        fail_type(path, expected, value)
    try:
        seconds = parse_go_duration(value) if isinstance(value, str) else float(value)
    except OverflowError:  # an integer too large for a float
        seconds = math.inf
    if seconds is None or not math.isfinite(seconds):
        fail_type(path, expected, value)
    if seconds < 0:
        fail(path, f"must not be negative, got {show(value)}")
    return seconds


def _xid_list(value: object, path: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list):
        fail_type(path, "a list of XIDs (non-negative integers)", value)
    xids: list[int] = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= _MAX_XID:
            fail_type(f"{path}[{i}]", "an XID (a non-negative integer)", item)
        xids.append(item)
    return xids


def _string_list(value: object, path: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        fail_type(path, "a list of strings", value)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            fail_type(f"{path}[{i}]", "a string", item)
    return list(value)


def _parse_imex(s: Section) -> Imex:
    path = s.path_of("channelIDs")
    raw = s.get_list("channelIDs") or []
    ids: list[int] = []
    for i, item in enumerate(raw):
        if isinstance(item, bool) or not isinstance(item, int):
            fail_type(f"{path}[{i}]", "an integer channel ID", item)
        ids.append(item)
    if tuple(ids) not in IMEX_CHANNEL_CONFIGS:
        fail(path, f"must be [] or [0] (the IMEX channel settings NVIDIA supports), got {show(raw)}")
    return Imex(channel_ids=tuple(ids), required=s.get_bool("required", False))

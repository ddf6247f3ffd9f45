"""A Config as the v1 document that means it, for the start-up line (NVIDIA's `Running with config: {...}`).

`config_document` writes every setting, defaults included, under the v1 field names, so the log shows what
is in force and not only what the file said; reading the document back gives the same Config
(tests/config/test_config_render.py).
"""

from __future__ import annotations

import json

from nvidia_device_plugin.config.v1 import (
    Config,
    Flags,
    Health,
    ReplicatedDevices,
    ReplicatedResources,
    Resources,
)

Document = dict[str, object]


def config_json(config: Config) -> str:
    """The config on one line of JSON (keys in the v1 order)."""
    return json.dumps(config_document(config), separators=(",", ":"))


def config_document(config: Config) -> Document:
    document: Document = {
        "version": config.version,
        "flags": _flags(config.flags),
        "resources": _resources(config.resources),
        "sharing": {},
        "health": _health(config.health),
        "imex": {"channelIDs": list(config.imex.channel_ids), "required": config.imex.required},
    }
    sharing: Document = {}
    if config.sharing.time_slicing.resources:
        sharing["timeSlicing"] = _replicated(config.sharing.time_slicing)
    if config.sharing.mps is not None and config.sharing.mps.resources:
        sharing["mps"] = _replicated(config.sharing.mps)
    document["sharing"] = sharing
    return document


def _flags(flags: Flags) -> Document:
    plugin = flags.plugin
    return {
        "migStrategy": flags.mig_strategy,
        "failOnInitError": flags.fail_on_init_error,
        "nvidiaDriverRoot": flags.nvidia_driver_root,
        "nvidiaDevRoot": flags.nvidia_dev_root,
        "mpsRoot": flags.mps_root,
        "gdsEnabled": flags.gds_enabled,
        "mofedEnabled": flags.mofed_enabled,
        "gdrcopyEnabled": flags.gdrcopy_enabled,
        "deviceDiscoveryStrategy": flags.device_discovery_strategy,
        "resourceNaming": flags.resource_naming,
        "plugin": {
            "passDeviceSpecs": plugin.pass_device_specs,
            "deviceListStrategy": list(plugin.device_list_strategy),
            "deviceIDStrategy": plugin.device_id_strategy,
            "sharedDevicesAllocationPolicy": plugin.shared_devices_allocation_policy,
            "cdiAnnotationPrefix": plugin.cdi_annotation_prefix,
            "nvidiaCTKPath": plugin.nvidia_ctk_path,
            "containerDriverRoot": plugin.container_driver_root,
            "cdiFeatureFlags": list(plugin.cdi_feature_flags),
            "cdiDisableHooks": list(plugin.cdi_disable_hooks),
            "cdiSpecDir": plugin.cdi_spec_dir,
        },
    }


def _resources(resources: Resources) -> Document:
    return {
        "gpus": [{"pattern": p.pattern, "name": p.name} for p in resources.gpus],
        "mig": [{"pattern": p.pattern, "name": p.name} for p in resources.mig],
    }


def _replicated(shared: ReplicatedResources) -> Document:
    entries: list[Document] = []
    for entry in shared.resources:
        item: Document = {"name": entry.name, "replicas": entry.replicas, "devices": _devices(entry.devices)}
        if entry.rename is not None:
            item["rename"] = entry.rename
        entries.append(item)
    return {
        "renameByDefault": shared.rename_by_default,
        "failRequestsGreaterThanOne": shared.fail_requests_greater_than_one,
        "resources": entries,
    }


def _devices(devices: ReplicatedDevices) -> object:
    if devices.refs:
        return list(devices.refs)
    return devices.count if devices.count is not None else "all"


def _health(health: Health) -> Document:
    critical = "all" if health.critical_xids is None else sorted(health.critical_xids)
    return {
        "disabled": health.disabled,
        "eventTypes": list(health.event_types),
        "ignoredXIDs": sorted(health.ignored_xids),
        "criticalXIDs": critical,
        "recovery": {
            "enabled": health.recovery.enabled,
            "gracePeriod": health.recovery.grace_period_seconds,
        },
    }

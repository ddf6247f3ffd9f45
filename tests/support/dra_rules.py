"""What the API server checks of DRA objects beyond their OpenAPI schema (which kubernetes-validate
checks): resource.k8s.io/v1 validation's limits, names and formats, from the API's field documentation.

`validate_objects` runs both, at every Kubernetes version the plugin supports for DRA.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import kubernetes_validate

# resource.k8s.io/v1 is GA from 1.34; kubernetes-validate must know it at each of these.
KUBERNETES_VERSIONS = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SEMVER = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def _qualified_name(name: str, where: str) -> None:
    domain, _, ident = name.rpartition("/")
    assert _C_IDENTIFIER.fullmatch(ident) and len(ident) <= 32, f"{where}: bad name {name!r}"
    if domain:
        assert _DNS_SUBDOMAIN.fullmatch(domain) and len(domain) <= 63, f"{where}: bad domain {name!r}"


def _device(device: dict[str, Any], where: str) -> None:
    name = device["name"]
    assert _DNS_LABEL.fullmatch(name) and len(name) <= 63, f"{where}: device name {name!r} is no DNS label"
    attributes, capacity = device.get("attributes", {}), device.get("capacity", {})
    assert len(attributes) + len(capacity) <= 32, f"{where}: {name} has over 32 attributes and capacities"
    for key, value in attributes.items():
        _qualified_name(key, f"{where}: {name}")
        assert len(value) == 1, f"{where}: {name}.{key} must hold exactly one value"
        ((kind, item),) = value.items()
        if kind == "string":
            assert len(item) <= 64, f"{where}: {name}.{key} is longer than 64 characters"
        if kind == "version":
            assert _SEMVER.fullmatch(item) and len(item) <= 64, f"{where}: {name}.{key} {item!r} is no semver"
    for key in capacity:
        _qualified_name(key, f"{where}: {name}")
    for taint in device.get("taints", []):
        _qualified_name(taint["key"], f"{where}: {name} taint")
        assert _LABEL_VALUE.fullmatch(taint.get("value", "")) and len(taint.get("value", "")) <= 63
        assert taint["effect"] in ("NoSchedule", "NoExecute")
    assert len(device.get("taints", [])) <= 4, f"{where}: {name} has over 4 taints"


def check_api_rules(obj: dict[str, Any]) -> None:
    where = f"{obj['kind']} {obj['metadata'].get('name') or obj['metadata'].get('generateName')}"
    if obj["kind"] == "DeviceClass":
        name = obj["metadata"]["name"]
        assert _DNS_SUBDOMAIN.fullmatch(name) and len(name) <= 253, f"{where}: bad name"
        return
    spec = obj["spec"]
    devices = spec.get("devices", [])
    limited = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    assert len(devices) <= (64 if limited else 128), f"{where}: {len(devices)} devices are too many"
    assert spec["pool"]["resourceSliceCount"] >= 1 and spec["pool"]["generation"] >= 0
    assert len({d["name"] for d in devices}) == len(devices), f"{where}: a device name twice"
    for device in devices:
        _device(device, where)


def validate_objects(objects: Iterable[dict[str, Any]]) -> int:
    """Validate each object at every supported version; how many were checked."""
    count = 0
    for obj in objects:
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{obj['kind']} at {version}: {exc}") from None
        check_api_rules(obj)
        count += 1
    return count

"""The sections that name resources, `resources` and `sharing`, -> their config.v1 types.

Resource names are qualified and checked as NVIDIA's NewResourceName does; device references are written
in the one spelling NVML reports. What no config may hold (replicas < 1, a count < 1, an empty device
list, two replica counts under one advertised name) the v1 types refuse; this module reports their
refusal at the document path (`_built`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from nvidia_device_plugin.config.document import Invalid, fail, fail_type
from nvidia_device_plugin.config.schema import (
    PATTERN_FIELDS,
    REPLICATED_FIELDS,
    REPLICATED_RESOURCE_FIELDS,
    Section,
)
from nvidia_device_plugin.config.v1 import (
    RESOURCE_PREFIX,
    SHARED_SUFFIX,
    InvalidValue,
    ReplicatedDevices,
    ReplicatedResource,
    ReplicatedResources,
    ResourcePattern,
    Resources,
    Sharing,
)

MAX_RESOURCE_NAME_LENGTH = 63

_PREFIX = RESOURCE_PREFIX + "/"
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_UUID = r"(?:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9a-fA-F]{32})"
_GPU_UUID = re.compile(rf"GPU-{_UUID}")
_MIG_UUID = re.compile(rf"MIG-{_UUID}")
_MIG_GPU_UUID = re.compile(rf"MIG-GPU-{_UUID}/[0-9]+/[0-9]+")
_GPU_INDEX = re.compile(r"[0-9]+")
_MIG_INDEX = re.compile(r"([0-9]+):([0-9]+)")

_Value = TypeVar("_Value")


def _built(owner: str, make: Callable[[], _Value]) -> _Value:
    """`make()`, with a v1 type's refusal reported at `owner`, the path of the value being built."""
    try:
        return make()
    except InvalidValue as exc:
        path, text = exc.located(owner)
        raise Invalid(path, text) from None


# ---------------------------------------------------------------------------------------------------------
# Resource names and patterns


def qualified_name(name: str, path: str) -> str:
    full = name if name.startswith(_PREFIX) else _PREFIX + name
    if len(full) > MAX_RESOURCE_NAME_LENGTH:
        fail(
            path,
            f"resource name {full!r} is {len(full)} characters long; the limit is {MAX_RESOURCE_NAME_LENGTH}",
        )
    if not _DNS_SUBDOMAIN.fullmatch(full[len(_PREFIX) :]):
        fail(
            path,
            f"{name!r} is not a valid resource name: after {_PREFIX!r} it must be lower-case letters, "
            "digits, '-' and '.', starting and ending with a letter or digit",
        )
    return full


def parse_resources(s: Section) -> Resources:
    return Resources(gpus=_parse_patterns(s, "gpus"), mig=_parse_patterns(s, "mig"))


def _parse_patterns(s: Section, key: str) -> tuple[ResourcePattern, ...]:
    entries = s.get_list(key) or []
    path = s.path_of(key)
    patterns = [
        s.notes.attempt(None, _parse_pattern, s, item, f"{path}[{i}]") for i, item in enumerate(entries)
    ]
    return tuple(p for p in patterns if p is not None)


def _parse_pattern(s: Section, item: object, path: str) -> ResourcePattern:
    entry = s.entry(item, path, PATTERN_FIELDS)
    pattern = entry.required_str("pattern")
    if not pattern:
        fail(entry.path_of("pattern"), "must not be empty (use '*' to match every device)")
    name = qualified_name(entry.required_str("name"), entry.path_of("name"))
    return ResourcePattern(pattern=pattern, name=name)


# ---------------------------------------------------------------------------------------------------------
# Sharing


def parse_sharing(s: Section) -> Sharing:
    time_slicing = ReplicatedResources()
    if s.raw("timeSlicing") is not None:  # each is read even when the other is wrong
        time_slicing = s.notes.attempt(time_slicing, _parse_replicated, s, "timeSlicing", fail_default=False)
    mps = None
    if s.raw("mps") is not None:
        mps = s.notes.attempt(None, _parse_replicated, s, "mps", fail_default=True)
    return Sharing(time_slicing=time_slicing, mps=mps)


def _parse_replicated(sharing: Section, key: str, fail_default: bool) -> ReplicatedResources:
    s = sharing.section(key, REPLICATED_FIELDS)
    rename_by_default = s.get_bool("renameByDefault", False)
    fail_requests = s.get_bool("failRequestsGreaterThanOne", fail_default)
    list_path = s.path_of("resources")
    if s.raw("resources") is not None and not isinstance(s.raw("resources"), list):
        fail_type(list_path, "a list", s.raw("resources"))
    entries = s.get_list("resources")
    if not entries:
        fail(list_path, f"no resources specified (list at least one resource to share, or remove {s.path})")
    listed: dict[str, int] = {}  # resource name -> entry index
    resources: list[ReplicatedResource] = []
    for i, item in enumerate(entries):
        # Each entry is read even when an earlier one is wrong, so every mistake is reported.
        entry = s.notes.attempt(None, _parse_listed_resource, s, item, i, listed, rename_by_default)
        if entry is not None:
            resources.append(entry)
    return _built(
        s.path,
        lambda: ReplicatedResources(
            rename_by_default=rename_by_default,
            fail_requests_greater_than_one=fail_requests,
            resources=tuple(resources),
        ),
    )


def _parse_listed_resource(
    s: Section, item: object, index: int, listed: dict[str, int], rename_by_default: bool
) -> ReplicatedResource:
    """Entry `index` of the sharing list in `s`; `listed` (resource name -> index) catches a resource
    listed twice."""
    entry = s.entry(item, f"{s.path_of('resources')}[{index}]", REPLICATED_RESOURCE_FIELDS)
    name = qualified_name(entry.required_str("name"), entry.path_of("name"))
    if name in listed:
        list_path = entry.path.rpartition("[")[0]
        fail(
            entry.path_of("name"), f"{name!r} is already listed at {list_path}[{listed[name]}]; list it once"
        )
    listed[name] = index
    return _parse_replicated_resource(entry, name, rename_by_default)


def _parse_replicated_resource(entry: Section, name: str, rename_by_default: bool) -> ReplicatedResource:
    replicas = entry.required_int("replicas")
    rename_raw = entry.optional_str("rename")
    rename = None if rename_raw is None else qualified_name(rename_raw, entry.path_of("rename"))
    if rename is None and rename_by_default:
        rename = _default_shared_name(name, entry.path_of("name"))
    devices = _parse_devices(entry)
    return _built(
        entry.path,
        lambda: ReplicatedResource(name=name, replicas=replicas, rename=rename, devices=devices),
    )


def _default_shared_name(name: str, path: str) -> str:
    shared = name + SHARED_SUFFIX
    if len(shared) > MAX_RESOURCE_NAME_LENGTH:
        fail(
            path,
            f"renameByDefault makes {shared!r}, which is {len(shared)} characters long; the limit is "
            f"{MAX_RESOURCE_NAME_LENGTH} (give this entry a shorter explicit rename)",
        )
    return shared


def _parse_devices(entry: Section) -> ReplicatedDevices:
    value = entry.raw("devices")
    path = entry.path_of("devices")
    expected = "'all', a positive device count, or a list of GPU/MIG indices or UUIDs"
    if value is None or value == "all":
        return ReplicatedDevices()
    if isinstance(value, (bool, str)):
        fail_type(path, expected, value)
    if isinstance(value, int):
        count = value
        return _built(entry.path, lambda: ReplicatedDevices(all=False, count=count))
    if isinstance(value, list):
        refs = tuple(dict.fromkeys(_device_ref(item, f"{path}[{i}]") for i, item in enumerate(value)))
        return _built(entry.path, lambda: ReplicatedDevices(all=False, refs=refs))
    fail_type(path, expected, value)


def _device_ref(value: object, path: str) -> str:
    """A device reference in the one spelling NVML would report: "3", "3:1", "GPU-<uuid>", "MIG-<uuid>"."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str):
        if _GPU_INDEX.fullmatch(value):
            return str(int(value))
        mig_index = _MIG_INDEX.fullmatch(value)
        if mig_index:
            return f"{int(mig_index.group(1))}:{int(mig_index.group(2))}"
        if _MIG_GPU_UUID.fullmatch(value):
            return "MIG-GPU-" + value[len("MIG-GPU-") :].lower()
        if _GPU_UUID.fullmatch(value) or _MIG_UUID.fullmatch(value):
            return value[:4] + value[4:].lower()
    fail_type(path, "a GPU index (0), MIG index (0:1), GPU UUID (GPU-...) or MIG UUID (MIG-...)", value)

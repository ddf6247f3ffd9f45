"""The keys the v1 format knows in each section, and `Section`: one mapping of the document, read by key.

Unknown keys are errors that name the path and suggest the closest known key (NVIDIA ignores them, so a
misspelt `passDeviceSpec` silently does nothing there). A missing key and an explicit null both mean
"not given", as they do for NVIDIA's pointer fields.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import TypeVar

from nvidia_device_plugin.config.document import Invalid, fail, fail_choice, fail_type, join_path, show

TOP_FIELDS = ("version", "flags", "resources", "sharing", "health", "imex")
FLAG_FIELDS = (
    "migStrategy",
    "failOnInitError",
    "restartOnDeviceUnhealthy",
    "nvidiaDriverRoot",
    "nvidiaDevRoot",
    "mpsRoot",
    "gdsEnabled",
    "mofedEnabled",
    "gdrcopyEnabled",
    "useNodeFeatureAPI",
    "deviceDiscoveryStrategy",
    "resourceNamePrefix",
    "plugin",
    "gfd",
)
PLUGIN_FIELDS = (
    "passDeviceSpecs",
    "deviceListStrategy",
    "deviceIDStrategy",
    "cdiAnnotationPrefix",
    "nvidiaCTKPath",
    "nvidiaCDIHookPath",
    "containerDriverRoot",
    "kubeletSocket",
    "cdiFeatureFlags",
)
GFD_FIELDS = ("oneshot", "noTimestamp", "noCleanupOnExit", "sleepInterval", "outputFile", "machineTypeFile")
RESOURCES_FIELDS = ("gpus", "mig")
PATTERN_FIELDS = ("pattern", "name")
SHARING_FIELDS = ("timeSlicing", "mps")
REPLICATED_FIELDS = ("renameByDefault", "failRequestsGreaterThanOne", "resources")
REPLICATED_RESOURCE_FIELDS = ("name", "rename", "devices", "replicas")
HEALTH_FIELDS = ("disabled", "eventTypes", "ignoredXIDs", "criticalXIDs", "recovery")
RECOVERY_FIELDS = ("enabled", "gracePeriod")
IMEX_FIELDS = ("channelIDs", "required")

# Setting one of these paths from outside the file also drops the file's aliases for it.
ALIASES = {"flags.plugin.nvidiaCTKPath": ("nvidiaCDIHookPath",)}

_Choice = TypeVar("_Choice", bound=str)


def unknown_field(path: str, key: object, known: Sequence[str]) -> Invalid:
    """The error for `key`, which `known` (the keys of the mapping at `path`) does not list."""
    child = join_path(path, key if isinstance(key, str) else show(key))
    suggestion: list[str] = []
    if isinstance(key, str):
        suggestion = [k for k in known if k.lower() == key.lower()] or difflib.get_close_matches(
            key, known, n=1
        )
    if suggestion:
        return Invalid(child, f"{child}: unknown field (did you mean {suggestion[0]}?)")
    return Invalid(child, f"{child}: unknown field (known fields here: {', '.join(known)})")


def choose(path: str, value: object, choices: Sequence[_Choice], hint: str = "") -> _Choice:
    """`value` as the member of `choices` it equals, so its Literal type follows; else name the choices."""
    if not isinstance(value, str):
        fail_type(path, "a string", value)
    for choice in choices:
        if choice == value:
            return choice
    fail_choice(path, choices, value, hint)


class Section:
    """One mapping of the document with its path; typed getters name the field and value on error."""

    def __init__(self, value: object, path: str, known: Sequence[str]) -> None:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            if not path:
                raise Invalid(path, f"the config must be a mapping of keys to values, got {show(value)}")
            fail_type(path, "a mapping", value)
        for key in value:
            if not isinstance(key, str) or key not in known:
                raise unknown_field(path, key, known)
        self._values: dict[str, object] = value
        self.path = path

    def path_of(self, key: str) -> str:
        return join_path(self.path, key)

    def raw(self, key: str) -> object:
        return self._values.get(key)

    def section(self, key: str, known: Sequence[str]) -> Section:
        return Section(self._values.get(key), self.path_of(key), known)

    def get_bool(self, key: str, default: bool) -> bool:
        value = self._values.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            fail_type(self.path_of(key), "a boolean", value)
        return value

    def get_str(self, key: str, default: str) -> str:
        value = self._values.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            fail_type(self.path_of(key), "a string", value)
        return value

    def optional_str(self, key: str) -> str | None:
        value = self._values.get(key)
        if value is not None and not isinstance(value, str):
            fail_type(self.path_of(key), "a string", value)
        return value

    def required_str(self, key: str) -> str:
        value = self._values.get(key)
        if value is None:
            fail(self.path_of(key), "required field is missing")
        if not isinstance(value, str):
            fail_type(self.path_of(key), "a string", value)
        return value

    def required_int(self, key: str) -> int:
        value = self._values.get(key)
        if value is None:
            fail(self.path_of(key), "required field is missing")
        if isinstance(value, bool) or not isinstance(value, int):
            fail_type(self.path_of(key), "an integer", value)
        return value

    def get_choice(self, key: str, choices: Sequence[_Choice], default: _Choice) -> _Choice:
        value = self._values.get(key)
        if value is None:
            return default
        return choose(self.path_of(key), value, choices)

    def get_list(self, key: str) -> list[object] | None:
        value = self._values.get(key)
        if value is None:
            return None
        if not isinstance(value, list):
            fail_type(self.path_of(key), "a list", value)
        return value

"""The keys the v1 format knows in each section, and `Section`: one mapping of the document, read by key.

Unknown keys name the path and suggest the closest known key. With `KeyNotes.strict` (check-config and
the loader's default) they are errors; the daemon reads leniently, as NVIDIA does (it ignores them), and
each one becomes a ConfigWarning, logged and counted, so a stray key never takes a node's GPUs away. When
the document has an error anyway, its unknown keys are reported with it in either mode: a misspelt
`replica:` explains the `replicas: required field is missing` that follows. `KeyNotes` collects every
problem of one document (`attempt`), so that one reading reports every mistake it can find. A
known key spelt in another case (`timeslicing`) is accepted with a warning naming the canonical spelling,
as NVIDIA's case-insensitive YAML decoding accepts it. A missing key and an explicit null both mean "not
given", as they do for NVIDIA's pointer fields.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from nvidia_device_plugin.config.document import Invalid, fail, fail_choice, fail_type, join_path, show
from nvidia_device_plugin.config.v1 import ConfigWarning, ConfigWarningKind

TOP_FIELDS = ("version", "flags", "resources", "sharing", "health", "imex", "dra")
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
    "resourceNaming",
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
    "cdiDisableHooks",
    "cdiSpecDir",
    "sharedDevicesAllocationPolicy",
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
_Value = TypeVar("_Value")
_Args = ParamSpec("_Args")


@dataclass
class KeyNotes:
    """How one document's keys are judged (`strict`: unknown keys are errors), what was let through, and
    every problem found so far, in document order (`problems`; `unknown` marks the unknown keys)."""

    strict: bool = True
    warnings: list[ConfigWarning] = field(default_factory=list)
    problems: list[Invalid] = field(default_factory=list)
    unknown: set[int] = field(default_factory=set)  # ids of the problems that are unknown keys

    def warn(self, kind: ConfigWarningKind, path: str, message: str) -> None:
        self.warnings.append(ConfigWarning(kind, path, message))

    def unknown_key(self, problem: Invalid) -> None:
        self.unknown.add(id(problem))
        self.problems.append(problem)
        self.warn("unknown-key", problem.path, f"{problem.text}; ignored")

    def attempt(
        self, instead: _Value, read: Callable[_Args, _Value], *args: _Args.args, **kwargs: _Args.kwargs
    ) -> _Value:
        """`read(*args, **kwargs)`, or `instead` with its problem noted, so that reading goes on to find the
        next problem."""
        try:
            return read(*args, **kwargs)
        except Invalid as problem:
            self.problems.append(problem)
            return instead

    def reported(self) -> list[Invalid]:
        """The problems that make the document invalid: all of them when strict or when any is an error
        (unknown keys then explain it), none when the only ones are unknown keys read leniently."""
        errors = [p for p in self.problems if id(p) not in self.unknown]
        return list(self.problems) if self.strict or errors else []


def unknown_field(path: str, key: object, known: Sequence[str]) -> Invalid:
    """The error for `key`, which `known` (the keys of the mapping at `path`) does not list."""
    child = join_path(path, key if isinstance(key, str) else show(key))
    suggestion: list[str] = []
    if isinstance(key, str):
        import difflib  # here: only a mistaken config needs it, not every start of the daemon

        suggestion = [k for k in known if k.lower() == key.lower()] or difflib.get_close_matches(
            key, known, n=1
        )
    if suggestion:
        return Invalid(child, f"{child}: unknown field (did you mean {suggestion[0]}?)")
    return Invalid(child, f"{child}: unknown field (known fields here: {', '.join(known)})")


def _same_but_case(key: object, known: Sequence[str]) -> str | None:
    if not isinstance(key, str):
        return None
    return next((k for k in known if k.lower() == key.lower()), None)


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

    def __init__(self, value: object, path: str, known: Sequence[str], notes: KeyNotes | None = None) -> None:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            if not path:
                raise Invalid(path, f"the config must be a mapping of keys to values, got {show(value)}")
            fail_type(path, "a mapping", value)
        self.notes = notes if notes is not None else KeyNotes()
        self.path = path
        self._values: dict[str, object] = self._known_values(value, known)

    def _known_values(self, value: dict[object, object], known: Sequence[str]) -> dict[str, object]:
        """`value` under the canonical keys; other keys are warned about (or refused when strict)."""
        values: dict[str, object] = {}
        for key, item in value.items():
            if isinstance(key, str) and key in known:
                values[key] = item
                continue
            canonical = _same_but_case(key, known)
            if canonical is None:
                self.notes.unknown_key(unknown_field(self.path, key, known))
                continue
            child = self.path_of(str(key))
            if canonical in value:
                # A flag or environment variable writes the canonical key over a file's other spelling.
                self.notes.warn("key-case", child, f"{child}: ignored, as {canonical} is also given")
                continue
            self.notes.warn("key-case", child, f"{child}: read as {canonical} (write it {canonical})")
            values[canonical] = item
        return values

    def path_of(self, key: str) -> str:
        return join_path(self.path, key)

    def raw(self, key: str) -> object:
        return self._values.get(key)

    def section(self, key: str, known: Sequence[str]) -> Section:
        return Section(self._values.get(key), self.path_of(key), known, self.notes)

    def entry(self, value: object, path: str, known: Sequence[str]) -> Section:
        """A mapping found inside this section (a list item), judged by the same notes."""
        return Section(value, path, known, self.notes)

    # The getters with a default note a wrong value and go on with the default (`KeyNotes.attempt`), so
    # one reading finds every mistake; the document is refused all the same.

    def get_bool(self, key: str, default: bool) -> bool:
        return self.notes.attempt(default, self._bool, key, default)

    def _bool(self, key: str, default: bool) -> bool:
        value = self._values.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            fail_type(self.path_of(key), "a boolean", value)
        return value

    def get_str(self, key: str, default: str) -> str:
        return self.notes.attempt(default, self._str, key, default)

    def _str(self, key: str, default: str) -> str:
        value = self._values.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            fail_type(self.path_of(key), "a string", value)
        return value

    def optional_str(self, key: str) -> str | None:
        value = self._values.get(key)
        if value is not None and not isinstance(value, str):
            self.notes.attempt(None, fail_type, self.path_of(key), "a string", value)
            return None
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
        return self.notes.attempt(default, choose, self.path_of(key), value, choices)

    def get_list(self, key: str) -> list[object] | None:
        value = self._values.get(key)
        if value is None:
            return None
        if not isinstance(value, list):
            self.notes.attempt(None, fail_type, self.path_of(key), "a list", value)
            return None
        return value

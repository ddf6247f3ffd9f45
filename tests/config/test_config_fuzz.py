"""Property tests: for any document the loader returns a Config or raises ConfigError, nothing else."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.loader import Override, build_config, parse_config, parse_config_text
from nvidia_device_plugin.config.options import CONFIG_OPTIONS
from nvidia_device_plugin.config.v1 import Config

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# fmt: off
KNOWN_KEYS = [
    "version", "flags", "resources", "sharing", "health", "imex", "migStrategy", "failOnInitError",
    "nvidiaDriverRoot", "nvidiaDevRoot", "mpsRoot", "plugin", "gfd", "passDeviceSpecs", "deviceListStrategy",
    "deviceIDStrategy", "nvidiaCTKPath", "nvidiaCDIHookPath", "sleepInterval", "gpus", "mig", "pattern",
    "name", "timeSlicing", "mps", "renameByDefault", "failRequestsGreaterThanOne", "replicas", "rename",
    "devices", "disabled", "eventTypes", "ignoredXIDs", "criticalXIDs", "recovery", "enabled", "gracePeriod",
    "channelIDs", "required",
]
PLAUSIBLE_STRINGS = [
    "v1", "v2", "", "none", "single", "mixed", "envvar", "volume-mounts", "cdi-cri", "envvar,cdi-cri", "uuid",
    "index", "all", "ALL", "gpu", "Gpu", "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "mig-1g.10gb", "*A100*",
    "1g.10gb", "0", "0:1", "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",
    "MIG-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",
    "60s", "1m30s", "5q", "EventTypeXidCriticalError", "yes", "true", "/run/nvidia/driver", "x" * 70,
]
# fmt: on

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=12),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(PLAUSIBLE_STRINGS),
    st.text(max_size=12),
)
keys = st.one_of(
    st.sampled_from(KNOWN_KEYS), st.text(max_size=8), st.integers(-2, 2), st.none(), st.booleans()
)
anything = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=4)),
    max_leaves=10,
)


def maybe(strategy: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """Mostly the plausible fragment, sometimes anything at all."""
    return st.one_of(strategy, strategy, strategy, anything)


def section(**fields: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return maybe(st.fixed_dictionaries({}, optional=fields))


small_int = st.integers(min_value=-1, max_value=9)
plausible = st.sampled_from(PLAUSIBLE_STRINGS)
resource_entry = section(
    name=maybe(plausible),
    replicas=maybe(small_int),
    rename=maybe(plausible),
    devices=maybe(st.one_of(st.just("all"), small_int, st.lists(st.one_of(small_int, plausible)))),
)
replicated = section(
    renameByDefault=maybe(st.booleans()),
    failRequestsGreaterThanOne=maybe(st.booleans()),
    resources=maybe(st.lists(resource_entry, max_size=3)),
)
patterns = maybe(st.lists(section(pattern=maybe(plausible), name=maybe(plausible)), max_size=3))
flags = section(
    migStrategy=maybe(plausible),
    failOnInitError=maybe(st.booleans()),
    nvidiaDriverRoot=maybe(plausible),
    mpsRoot=maybe(plausible),
    plugin=section(
        passDeviceSpecs=maybe(st.booleans()),
        deviceListStrategy=maybe(st.one_of(plausible, st.lists(plausible))),
        deviceIDStrategy=maybe(plausible),
    ),
    gfd=section(sleepInterval=maybe(st.one_of(st.integers(), plausible))),
)
health = section(
    disabled=maybe(st.booleans()),
    eventTypes=maybe(st.lists(plausible, max_size=3)),
    ignoredXIDs=maybe(st.lists(st.integers(min_value=-1, max_value=200), max_size=4)),
    criticalXIDs=maybe(
        st.one_of(st.sampled_from(["all", "ALL", "some"]), st.lists(st.integers(0, 200), max_size=4))
    ),
    recovery=section(enabled=maybe(st.booleans()), gracePeriod=maybe(st.one_of(st.floats(), plausible))),
)
documents = section(
    version=maybe(st.sampled_from(["v1", "", "v2"])),
    flags=flags,
    resources=section(gpus=patterns, mig=patterns),
    sharing=section(timeSlicing=replicated, mps=replicated),
    health=health,
    imex=section(channelIDs=maybe(st.lists(small_int, max_size=2)), required=maybe(st.booleans())),
)


def outcome(load: object) -> Config | ConfigError:
    assert callable(load)
    try:
        config = load()
    except ConfigError as exc:
        assert str(exc)  # every error says something
        return exc
    assert isinstance(config, Config)
    return config


@FUZZ
@given(documents)
def test_any_document_parses_or_is_a_config_error(doc: object) -> None:
    outcome(lambda: parse_config(doc, "fuzz.yaml"))


@FUZZ
@given(documents)
def test_the_same_document_as_yaml_text_behaves_the_same(doc: object) -> None:
    direct = outcome(lambda: parse_config(doc, "fuzz.yaml"))
    try:
        text = yaml.safe_dump(doc)
    except yaml.YAMLError:
        return
    via_text = outcome(lambda: parse_config_text(text, "fuzz.yaml"))
    assert type(via_text) is type(direct)
    if isinstance(direct, Config):
        assert via_text == direct


@FUZZ
@given(st.text(max_size=200))
def test_any_text_parses_or_is_a_config_error(text: str) -> None:
    outcome(lambda: parse_config_text(text, "fuzz.yaml"))


YAML_LINES = [
    *["version: v1", "flags:", "  migStrategy: mixed", "sharing:", "  timeSlicing:", "    resources:"],
    *["    - name: gpu", "      replicas: 4", "  - [", "&a [*a]", "{", "}", ": :", "\t", "- ", "? [x]"],
    *[
        "!!python/object/apply:os.system [ls]",
        "key: !!binary AAAA",
        "x: 1" * 3,
        "---",
        "...",
        "'unterminated",
    ],
    "replicas: 1" + "0" * 5000,  # beyond Python's int-from-string digit limit
]
yaml_ish_text = st.lists(st.sampled_from(YAML_LINES), max_size=8).map("\n".join)


@FUZZ
@given(yaml_ish_text)
def test_yaml_shaped_text_parses_or_is_a_config_error(text: str) -> None:
    outcome(lambda: parse_config_text(text, "fuzz.yaml"))


override_values = st.one_of(
    scalars, st.lists(st.sampled_from(PLAUSIBLE_STRINGS), max_size=3), st.lists(small_int)
)


@FUZZ
@given(
    documents, st.dictionaries(st.sampled_from([o.path for o in CONFIG_OPTIONS]), override_values, max_size=4)
)
def test_overrides_on_any_document_parse_or_are_config_errors(doc: object, values: dict[str, object]) -> None:
    overrides = {path: Override(value, f"env {path}") for path, value in values.items()}
    result = outcome(lambda: build_config(doc, overrides, "fuzz.yaml"))
    if isinstance(result, ConfigError):
        assert str(result).startswith(("fuzz.yaml: ", "env "))

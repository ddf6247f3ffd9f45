"""config.loader: every bad input is a ConfigError naming the field path and the bad value."""

from __future__ import annotations

import pytest

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.loader import (
    ConfigProblems,
    parse_config,
    parse_config_text,
    parse_document_text,
)
from nvidia_device_plugin.config.v1 import HEALTH_EVENT_TYPES

from support.configs import parse

# --------------------------------------------------------------------------------------------------------
# Errors: each bad input names the field path and the bad value

LONG = "x" * 60
UUID = "4cf8db2d-06c0-7d70-1a51-e59b25b2c16c"
DEVICE_REF = "must be a GPU index (0), MIG index (0:1), GPU UUID (GPU-...) or MIG UUID (MIG-...), got"
DEVICES = "must be 'all', a positive device count, or a list of GPU/MIG indices or UUIDs, got"
EVENT_TYPES = ", ".join(HEALTH_EVENT_TYPES)
LIST_STRATEGIES = "envvar, volume-mounts, cdi-annotations, cdi-cri"
GRACE = "health.recovery.gracePeriod must be a number of seconds or a duration such as '5m', got"
IMEX = "imex.channelIDs: must be [] or [0] (the IMEX channel settings NVIDIA supports), got"


def ts(*entries: str, extra: str = "") -> str:
    """A time-slicing document with the given flow-style resource entries."""
    return f"sharing: {{timeSlicing: {{{extra}resources: [{', '.join(entries)}]}}}}"


def ts_devices(devices: str) -> str:
    return ts(f"{{name: gpu, replicas: 2, devices: {devices}}}")


TS = "sharing.timeSlicing.resources"
MPS_GPU = "sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}"

BAD_INPUTS = [
    ("version: v2", "version: unsupported config version 'v2' (supported: v1)"),
    ("version: 1", "version must be a string, got 1"),
    ("[1, 2]", "the config must be a mapping of keys to values, got [1, 2]"),
    ("{1: x}", "1: unknown field (known fields here"),
    ("flags: mixed", "flags must be a mapping, got 'mixed'"),
    ("flagz: {}", "flagz: unknown field (did you mean flags?)"),
    ("zzz: 1", "zzz: unknown field (known fields here: version, flags"),
    (
        "flags: {plugin: {passDeviceSpec: 1}}",
        "flags.plugin.passDeviceSpec: unknown field (did you mean passDeviceSpecs?)",
    ),
    ("flags: {failOnInitError: 'yes'}", "flags.failOnInitError must be a boolean, got 'yes'"),
    ("flags: {failOnInitError: 1}", "flags.failOnInitError must be a boolean, got 1"),
    ("flags: {migStrategy: mix}", "flags.migStrategy must be one of none, single, mixed, got 'mix'"),
    ("flags: {migStrategy: true}", "flags.migStrategy must be a string, got true"),
    ("flags: {nvidiaDriverRoot: 7}", "flags.nvidiaDriverRoot must be a string, got 7"),
    (
        "flags: {deviceDiscoveryStrategy: cuda}",
        "flags.deviceDiscoveryStrategy must be one of auto, nvml, tegra, got 'cuda'",
    ),
    (
        "flags: {resourceNamePrefix: example.com}",
        "flags.resourceNamePrefix: only 'nvidia.com' is supported, got 'example.com'",
    ),
    (
        "flags: {plugin: {deviceIDStrategy: serial}}",
        "flags.plugin.deviceIDStrategy must be one of uuid, index, got 'serial'",
    ),
    (
        "flags: {plugin: {deviceListStrategy: [envvar, mounts]}}",
        f"flags.plugin.deviceListStrategy[1] must be one of {LIST_STRATEGIES}, got 'mounts'",
    ),
    (
        "flags: {plugin: {deviceListStrategy: 'envvar,cdi-cri'}}",
        "got 'envvar,cdi-cri' (write several strategies as a YAML list)",
    ),
    (
        "flags: {plugin: {deviceListStrategy: []}}",
        "flags.plugin.deviceListStrategy: name at least one strategy",
    ),
    (
        "flags: {plugin: {deviceListStrategy: 3}}",
        "flags.plugin.deviceListStrategy must be a string or a list of strings, got 3",
    ),
    (
        "flags: {plugin: {nvidiaCTKPath: /a, nvidiaCDIHookPath: /b}}",
        "flags.plugin.nvidiaCDIHookPath: '/b' contradicts",
    ),
    (
        "flags: {gfd: {sleepInterval: soon}}",
        "flags.gfd.sleepInterval must be a duration such as '60s' or '1m30s', a number of nanoseconds, or "
        "'infinite', got 'soon'",
    ),
    ("flags: {gfd: {oneshot: maybe}}", "flags.gfd.oneshot must be a boolean, got 'maybe'"),
    ("resources: {gpus: {pattern: x}}", "resources.gpus must be a list, got {'pattern': 'x'}"),
    ("resources: {gpus: [{pattern: '*'}]}", "resources.gpus[0].name: required field is missing"),
    ("resources: {gpus: [{name: a100}]}", "resources.gpus[0].pattern: required field is missing"),
    (
        "resources: {gpus: [{pattern: '', name: a}]}",
        "resources.gpus[0].pattern: must not be empty (use '*' to match every device)",
    ),
    (
        "resources: {gpus: [{pattern: '*', name: a}, {pattern: '*', name: A100}]}",
        "resources.gpus[1].name: 'A100' is not",
    ),
    (
        "resources: {mig: [{pattern: '1g.5gb', name: 'mig_small'}]}",
        "resources.mig[0].name: 'mig_small' is not a valid",
    ),
    ("resources: {mig: [{pattern: '1g', name: 'x', rename: y}]}", "resources.mig[0].rename: unknown field"),
    (
        f"resources: {{gpus: [{{pattern: '*', name: {LONG}}}]}}",
        f"name: resource name 'nvidia.com/{LONG}' is 71",
    ),
    (
        "resources: {gpus: [{pattern: '*', name: example.com/gpu}]}",
        "gpus[0].name: 'example.com/gpu' is not a valid",
    ),
    (ts(), f"{TS}: no resources specified"),
    ("sharing: {timeSlicing: {renameByDefault: true}}", f"{TS}: no resources specified"),
    ("sharing: {mps: {}}", "sharing.mps.resources: no resources specified"),
    ("sharing: {timeSlicing: [gpu]}", "sharing.timeSlicing must be a mapping, got ['gpu']"),
    (ts("{name: gpu}"), f"{TS}[0].replicas: required field is missing"),
    (ts("{replicas: 2}"), f"{TS}[0].name: required field is missing"),
    (ts("{name: gpu, replicas: 0}"), f"{TS}[0].replicas must be >= 1, got 0"),
    (ts("{name: gpu, replicas: -3}"), f"{TS}[0].replicas must be >= 1, got -3"),
    (ts("{name: gpu, replicas: 2.0}"), f"{TS}[0].replicas must be an integer, got 2.0"),
    (ts("{name: gpu, replicas: 100000}"), f"{TS}[0].replicas: at most 4096 replicas per device"),
    (ts("{name: gpu, replicas: '4'}"), f"{TS}[0].replicas must be an integer, got '4'"),
    (ts("{name: gpu, replicas: true}"), f"{TS}[0].replicas must be an integer, got true"),
    (ts("{name: Gpu, replicas: 2}"), f"{TS}[0].name: 'Gpu' is not a valid resource name"),
    (ts("{name: gpu, replicas: 2, rename: 'a b'}"), f"{TS}[0].rename: 'a b' is not a valid resource name"),
    (ts("{name: gpu, replicas: 2, renames: x}"), f"{TS}[0].renames: unknown field (did you mean rename?)"),
    (
        ts("{name: gpu, replicas: 2}", "{name: nvidia.com/gpu, replicas: 3}"),
        f"{TS}[1].name: 'nvidia.com/gpu' is already listed at {TS}[0]",
    ),
    (
        "sharing: {mps: {resources: [{name: a, replicas: 2, rename: s}, {name: b, replicas: 3, rename: s}]}}",
        "sharing.mps.resources[1].replicas: 'nvidia.com/s' is also advertised by sharing.mps.resources[0]",
    ),
    (
        ts("{name: gpu, replicas: 2}", "{name: mig-1g.5gb, replicas: 3, rename: gpu}"),
        f"{TS}[1].replicas: 'nvidia.com/gpu' is also advertised by {TS}[0] with 2 replicas",
    ),
    (
        ts(f"{{name: {'y' * 50}, replicas: 2}}", extra="renameByDefault: true, "),
        f"{TS}[0].name: renameByDefault makes 'nvidia.com/yyyy",
    ),
    (
        ts_devices("some"),
        f"{TS}[0].devices {DEVICES} 'some'",
    ),
    (ts_devices("0"), f"{TS}[0].devices: a device count must be > 0, got 0"),
    (
        ts_devices("true"),
        f"{TS}[0].devices {DEVICES} true",
    ),
    (
        ts_devices("{all: true}"),
        f"{TS}[0].devices {DEVICES} {{'all': true}}",
    ),
    (ts_devices("[]"), f"{TS}[0].devices: the device list is empty (use 'all' to share every device)"),
    (ts_devices("[-1]"), f"{TS}[0].devices[0] {DEVICE_REF} -1"),
    (ts_devices("['GPU-UUID']"), f"{TS}[0].devices[0] {DEVICE_REF} 'GPU-UUID'"),
    (ts_devices(f"['MIG-GPU-{UUID}']"), f"{TS}[0].devices[0] {DEVICE_REF} 'MIG-GPU-{UUID}'"),
    (ts_devices("[0, 1.5]"), f"{TS}[0].devices[1] {DEVICE_REF} 1.5"),
    (ts_devices("[0, '1:x']"), f"{TS}[0].devices[1] {DEVICE_REF} '1:x'"),
    (
        f"flags: {{migStrategy: mixed}}\n{MPS_GPU}",
        "flags.migStrategy: 'mixed' cannot be combined with sharing.mps",
    ),
    (f"flags: {{mpsRoot: ''}}\n{MPS_GPU}", "flags.mpsRoot: must not be empty when sharing.mps is configured"),
    ("health: {disabled: off}\nhealth2: 1", "health2: unknown field (did you mean health?)"),
    ("health: {disabled: 'off'}", "health.disabled must be a boolean, got 'off'"),
    (
        "health: {eventTypes: [EventTypeXid]}",
        f"health.eventTypes[0] must be one of {EVENT_TYPES}, got 'EventTypeXid'",
    ),
    (
        "health: {eventTypes: EventTypeXidCriticalError}",
        "health.eventTypes must be a list of strings, got 'EventType",
    ),
    (
        "health: {ignoredXIDs: [13, '31']}",
        "health.ignoredXIDs[1] must be an XID (a non-negative integer), got '31'",
    ),
    ("health: {ignoredXIDs: [-1]}", "health.ignoredXIDs[0] must be an XID (a non-negative integer), got -1"),
    (
        "health: {ignoredXIDs: 13}",
        "health.ignoredXIDs must be a list of XIDs (non-negative integers), got 13",
    ),
    ("health: {criticalXIDs: some}", "health.criticalXIDs must be 'all' or a list of XIDs, got 'some'"),
    ("health: {criticalXIDs: 48}", "health.criticalXIDs must be 'all' or a list of XIDs, got 48"),
    (
        "health: {ignoredXIDs: [48, 13], criticalXIDs: [79, 48]}",
        "health.criticalXIDs: XID 48 is also in health.ignoredXIDs",
    ),
    ("health: {recovery: {enabled: 1}}", "health.recovery.enabled must be a boolean, got 1"),
    (
        "health: {recovery: {gracePeriod: later}}",
        f"{GRACE} 'later'",
    ),
    ("health: {recovery: {gracePeriod: -5}}", "health.recovery.gracePeriod: must not be negative, got -5"),
    (
        "health: {recovery: {gracePeriod: .nan}}",
        f"{GRACE} nan",
    ),
    (
        "health: {recovery: {gracePeriod: 1.0e+999}}",
        f"{GRACE} inf",
    ),
    ("health: {recovery: {grace: 5}}", "health.recovery.grace: unknown field (did you mean gracePeriod?)"),
    (
        "imex: {channelIDs: [1]}",
        f"{IMEX} [1]",
    ),
    (
        "imex: {channelIDs: [0, 0]}",
        f"{IMEX} [0, 0]",
    ),
    ("imex: {channelIDs: ['0']}", "imex.channelIDs[0] must be an integer channel ID, got '0'"),
    ("imex: {required: 'true'}", "imex.required must be a boolean, got 'true'"),
]


@pytest.mark.parametrize(("text", "message"), BAD_INPUTS, ids=[m[:60] for _, m in BAD_INPUTS])
def test_bad_input_is_a_config_error_naming_path_and_value(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(text)
    assert str(err.value).startswith("test.yaml: ")
    assert message in str(err.value)


def test_old_restart_on_device_unhealthy_flag_is_accepted_and_type_checked() -> None:
    parse_config_text("version: v1\nflags:\n  restartOnDeviceUnhealthy: true\n", "old.yaml")
    with pytest.raises(ConfigError, match=r"flags\.restartOnDeviceUnhealthy"):
        parse_config_text("version: v1\nflags:\n  restartOnDeviceUnhealthy: sometimes\n", "old.yaml")


@pytest.mark.parametrize(("text", "message"), BAD_INPUTS, ids=[m[:60] for _, m in BAD_INPUTS])
def test_one_mistake_is_reported_once(text: str, message: str) -> None:
    # Reading goes on after a mistake (to find the next one), and must not invent more from the first.
    with pytest.raises(ConfigError) as err:
        parse(text)
    problems = (
        err.value.problems if isinstance(err.value, ConfigProblems) else (("test.yaml", str(err.value)),)
    )
    assert len(problems) == 1, problems


TYPOS = """
flags:
  migStrategy: mixd
  plugin: {passDeviceSpec: true}
sharing:
  timeSlicing:
    resources:
    - {name: nvidia.com/gpu, replica: 4}
    - {name: nvidia.com/mig-1g.10gb, replicas: 0, renme: x}
health: {ignoredXIDs: [-1]}
"""
EVERY_MISTAKE = [
    "flags.migStrategy must be one of none, single, mixed, got 'mixd'",
    "flags.plugin.passDeviceSpec: unknown field (did you mean passDeviceSpecs?)",
    "sharing.timeSlicing.resources[0].replica: unknown field (did you mean replicas?)",
    "sharing.timeSlicing.resources[0].replicas: required field is missing",
    "sharing.timeSlicing.resources[1].renme: unknown field (did you mean rename?)",
    "sharing.timeSlicing.resources[1].replicas must be >= 1, got 0",
    "health.ignoredXIDs[0] must be an XID (a non-negative integer), got -1",
]


@pytest.mark.parametrize("strict", [True, False], ids=["check-config", "daemon"])
def test_every_mistake_is_reported_with_its_hint_in_document_order(strict: bool) -> None:
    # Read leniently (the daemon), the unknown keys are reported too: they explain the missing `replicas`.
    with pytest.raises(ConfigProblems) as err:
        parse_config(parse_document_text(TYPOS), "typos.yaml", strict=strict)
    assert err.value.lines == tuple(f"typos.yaml: {line}" for line in EVERY_MISTAKE)
    assert str(err.value) == "typos.yaml: " + "; ".join(EVERY_MISTAKE)


def test_unknown_keys_alone_are_errors_only_when_strict() -> None:
    text = (
        "flags: {plugin: {passDeviceSpec: true}}\n"
        "sharing: {timeslicing: {resources: [{name: gpu, replicas: 2}]}}"
    )
    with pytest.raises(ConfigProblems) as err:
        parse_config(parse_document_text(text), "t.yaml", strict=True)
    assert err.value.lines == (
        "t.yaml: flags.plugin.passDeviceSpec: unknown field (did you mean passDeviceSpecs?)",
    )
    lenient = parse_config(parse_document_text(text), "t.yaml", strict=False)
    assert lenient.unknown_keys == ("flags.plugin.passDeviceSpec",)
    assert lenient.sharing.strategy == "time-slicing"  # the case-only spelling is read, with a warning

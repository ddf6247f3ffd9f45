"""config.loader: the v1 format as NVIDIA documents it, our example files, and errors that name the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvidia_device_plugin.config.loader import (
    Override,
    build_config,
    load_config_file,
    parse_config,
    parse_config_text,
    parse_go_duration,
    qualify_resource_name,
)
from nvidia_device_plugin.config.v1 import (
    DEFAULT_IGNORED_XIDS,
    HEALTH_EVENT_TYPES,
    Config,
    ReplicatedDevices,
    ReplicatedResource,
    ResourcePattern,
)
from nvidia_device_plugin.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def parse(text: str) -> Config:
    return parse_config_text(text, "test.yaml")


# --------------------------------------------------------------------------------------------------------
# The example files in configs/


def test_every_example_file_is_covered_here() -> None:
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(
        [
            "mig-mixed.yaml",
            "mig-single.yaml",
            "mps.yaml",
            "per-model-renames.yaml",
            "time-slicing-rename.yaml",
            "time-slicing.yaml",
        ]
    )


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_example_file_starts_with_a_comment_saying_what_it_does(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and len(first) > 20


def test_example_time_slicing() -> None:
    config = load_config_file(CONFIGS / "time-slicing.yaml")
    assert config.sharing.strategy == "time-slicing"
    ts = config.sharing.time_slicing
    assert ts.resources == (ReplicatedResource(name="nvidia.com/gpu", replicas=4),)
    assert ts.rename_by_default is False
    assert ts.fail_requests_greater_than_one is False
    assert config.flags.mig_strategy == "none"


def test_example_time_slicing_rename() -> None:
    config = load_config_file(CONFIGS / "time-slicing-rename.yaml")
    ts = config.sharing.time_slicing
    assert ts.rename_by_default is True
    assert ts.fail_requests_greater_than_one is True
    assert ts.resources == (
        ReplicatedResource(name="nvidia.com/gpu", replicas=4, rename="nvidia.com/gpu.shared"),
    )


def test_example_mig_mixed() -> None:
    config = load_config_file(CONFIGS / "mig-mixed.yaml")
    assert config.flags.mig_strategy == "mixed"
    assert config.sharing.strategy == "none"
    assert config.resources.gpus == () and config.resources.mig == ()


def test_example_mig_single() -> None:
    config = load_config_file(CONFIGS / "mig-single.yaml")
    assert config.flags.mig_strategy == "single"
    assert config.sharing.strategy == "none"


def test_example_per_model_renames() -> None:
    config = load_config_file(CONFIGS / "per-model-renames.yaml")
    assert config.flags.mig_strategy == "mixed"
    assert config.resources.gpus == (
        ResourcePattern(pattern="*A100*", name="nvidia.com/a100"),
        ResourcePattern(pattern="*H100*", name="nvidia.com/h100"),
    )
    assert config.resources.mig == (
        ResourcePattern(pattern="1g.10gb", name="nvidia.com/mig-small"),
        ResourcePattern(pattern="3g.40gb", name="nvidia.com/mig-medium"),
    )


def test_example_mps() -> None:
    config = load_config_file(CONFIGS / "mps.yaml")
    assert config.sharing.strategy == "mps"
    mps = config.sharing.active
    assert mps.resources == (ReplicatedResource(name="nvidia.com/gpu", replicas=4),)
    assert mps.fail_requests_greater_than_one is True  # NVIDIA's MPS default
    assert config.flags.mps_root == "/run/nvidia/mps"


# --------------------------------------------------------------------------------------------------------
# Compatibility: NVIDIA's documented examples (README.md, docs/customizing.md, GFD docs), transcribed


def test_nvidia_readme_flags_file() -> None:
    config = parse(
        """
version: v1
flags:
  migStrategy: "none"
  failOnInitError: true
  nvidiaDriverRoot: "/"
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: "envvar"
    deviceIDStrategy: "uuid"
"""
    )
    assert config == Config()  # every value spelled out is the default


def test_nvidia_readme_multiple_config_example_config1() -> None:
    config = parse(
        """
version: v1
flags:
  migStrategy: "mixed" # Only change from config0.yaml
  failOnInitError: true
  nvidiaDriverRoot: "/"
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: envvar
    deviceIDStrategy: uuid
"""
    )
    assert config.flags.mig_strategy == "mixed"
    assert config.flags.plugin.device_list_strategy == ("envvar",)


def test_nvidia_readme_time_slicing_10_replicas() -> None:
    config = parse(
        """
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""
    )
    assert config.sharing.strategy == "time-slicing"
    (resource,) = config.sharing.active.resources
    assert (resource.name, resource.replicas, resource.rename) == ("nvidia.com/gpu", 10, None)
    assert resource.devices == ReplicatedDevices(all=True)


def test_nvidia_readme_time_slicing_rename_by_default() -> None:
    config = parse(
        """
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""
    )
    (resource,) = config.sharing.active.resources
    assert resource.rename == "nvidia.com/gpu.shared"
    assert config.sharing.active.fail_requests_greater_than_one is False


def test_nvidia_readme_mps_and_mps_rename() -> None:
    plain = parse(
        "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 10\n"
    )
    renamed = parse(
        "version: v1\nsharing:\n  mps:\n    renameByDefault: true\n"
        "    resources:\n    - name: nvidia.com/gpu\n      replicas: 10\n"
    )
    assert plain.sharing.strategy == renamed.sharing.strategy == "mps"
    assert plain.sharing.active.resources[0].rename is None
    assert renamed.sharing.active.resources[0].rename == "nvidia.com/gpu.shared"
    assert plain.sharing.active.fail_requests_greater_than_one is True


def test_nvidia_gpu_operator_mixed_mig_time_slicing_example() -> None:
    config = parse(
        """
version: v1
flags:
  migStrategy: mixed
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 8
    - name: nvidia.com/mig-1g.5gb
      replicas: 2
    - name: nvidia.com/mig-2g.10gb
      replicas: 2
    - name: nvidia.com/mig-3g.20gb
      replicas: 3
    - name: nvidia.com/mig-7g.40gb
      replicas: 7
"""
    )
    assert [(r.name, r.replicas) for r in config.sharing.active.resources] == [
        ("nvidia.com/gpu", 8),
        ("nvidia.com/mig-1g.5gb", 2),
        ("nvidia.com/mig-2g.10gb", 2),
        ("nvidia.com/mig-3g.20gb", 3),
        ("nvidia.com/mig-7g.40gb", 7),
    ]


def test_nvidia_gfd_shared_config_loads_and_gfd_flags_are_ignored() -> None:
    config = parse(
        """
version: v1
flags:
  migStrategy: "none"
  failOnInitError: true
  nvidiaDriverRoot: "/"
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: "envvar"
    deviceIDStrategy: "uuid"
  gfd:
    oneshot: false
    noTimestamp: false
    outputFile: /etc/kubernetes/node-feature-discovery/features.d/gfd
    sleepInterval: 60s
"""
    )
    assert config == Config()


def test_nvidia_helm_values_config_map_entries() -> None:
    for strategy in ("none", "single", "mixed"):
        assert parse(f"version: v1\nflags:\n  migStrategy: {strategy}\n").flags.mig_strategy == strategy


def test_nvidia_readme_imex_section_is_accepted() -> None:
    config = parse("version: v1\nimex:\n  channelIDs: [0]\n  required: true\n")
    assert config.imex.channel_ids == (0,)
    assert config.imex.required is True


def test_nvidia_replica_device_reference_forms() -> None:
    # The forms NVIDIA's replicas_test.go accepts, as one list.
    config = parse(
        """
sharing:
  timeSlicing:
    resources:
    - name: gpu
      replicas: 2
      devices:
      - 0
      - "1"
      - "0:0"
      - GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c
      - MIG-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c
      - MIG-GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c/0/0
"""
    )
    assert config.sharing.active.resources[0].devices == ReplicatedDevices(
        all=False,
        refs=(
            "0",
            "1",
            "0:0",
            "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",
            "MIG-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",
            "MIG-GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c/0/0",
        ),
    )


def test_nvidia_newer_flags_are_accepted() -> None:
    config = parse(
        """
flags:
  mpsRoot: /run/nvidia/mps
  nvidiaDevRoot: /dev-root
  gdrcopyEnabled: true
  gdsEnabled: true
  mofedEnabled: true
  useNodeFeatureAPI: true
  deviceDiscoveryStrategy: nvml
  resourceNamePrefix: nvidia.com
  plugin:
    deviceListStrategy: [envvar, cdi-annotations]
    cdiAnnotationPrefix: cdi.k8s.io/
    nvidiaCTKPath: /usr/local/bin/nvidia-ctk
    containerDriverRoot: /driver-root
    kubeletSocket: /var/lib/kubelet/device-plugins/kubelet.sock
    cdiFeatureFlags: [feature-a]
  gfd:
    oneshot: true
    noCleanupOnExit: true
    sleepInterval: 60000000000
    machineTypeFile: /sys/class/dmi/id/product_name
"""
    )
    flags = config.flags
    assert (flags.gdrcopy_enabled, flags.gds_enabled, flags.mofed_enabled) == (True, True, True)
    assert flags.nvidia_dev_root == "/dev-root"
    assert flags.plugin.device_list_strategy == ("envvar", "cdi-annotations")
    assert flags.plugin.nvidia_ctk_path == "/usr/local/bin/nvidia-ctk"


def test_nvidia_health_section() -> None:
    config = parse(
        """
health:
  disabled: false
  eventTypes: [EventTypeXidCriticalError]
  ignoredXIDs: [13, 31]
  criticalXIDs: all
"""
    )
    assert config.health.event_types == ("EventTypeXidCriticalError",)
    assert config.health.ignored_xids == frozenset({13, 31})
    assert config.health.critical_xids is None
    assert config.health.is_critical(48) and not config.health.is_critical(31)


def test_nvidia_gke_style_health_lists_critical_xids_only() -> None:
    config = parse("health:\n  criticalXIDs: [48]\n")
    assert config.health.critical_xids == frozenset({48})
    assert config.health.is_critical(48) and not config.health.is_critical(79)


# --------------------------------------------------------------------------------------------------------
# Defaults and NVIDIA's semantics


@pytest.mark.parametrize(
    "text", ["", "\n", "# only a comment\n", "---\n", "version: v1\n", "version: ''\n", "{}"]
)
def test_empty_documents_mean_all_defaults(text: str) -> None:
    assert parse(text) == Config()


def test_null_sections_mean_defaults() -> None:
    assert parse("flags:\nresources:\nsharing:\nhealth:\nimex:\n") == Config()
    assert parse("flags: {migStrategy: null, plugin: null}\n") == Config()


def test_dev_root_defaults_to_driver_root_as_nvidia_does() -> None:
    assert (
        parse("flags: {nvidiaDriverRoot: /run/nvidia/driver}").flags.nvidia_dev_root == "/run/nvidia/driver"
    )
    both = parse("flags: {nvidiaDriverRoot: /run/nvidia/driver, nvidiaDevRoot: /}")
    assert both.flags.nvidia_dev_root == "/"


def test_device_list_strategy_string_or_list() -> None:
    assert parse(
        "flags: {plugin: {deviceListStrategy: volume-mounts}}"
    ).flags.plugin.device_list_strategy == ("volume-mounts",)
    listed = parse("flags: {plugin: {deviceListStrategy: [cdi-cri, envvar, cdi-cri]}}")
    assert listed.flags.plugin.device_list_strategy == ("cdi-cri", "envvar")


def test_nvidia_cdi_hook_path_is_an_alias_of_nvidia_ctk_path() -> None:
    config = parse("flags: {plugin: {nvidiaCDIHookPath: /usr/bin/nvidia-cdi-hook}}")
    assert config.flags.plugin.nvidia_ctk_path == "/usr/bin/nvidia-cdi-hook"


def test_mps_fail_requests_default_can_be_relaxed_and_time_slicing_default_is_false() -> None:
    relaxed = parse(
        "sharing: {mps: {failRequestsGreaterThanOne: false, resources: [{name: gpu, replicas: 2}]}}"
    )
    assert relaxed.sharing.active.fail_requests_greater_than_one is False
    ts = parse("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}}")
    assert ts.sharing.active.fail_requests_greater_than_one is False


def test_names_are_prefixed_and_explicit_rename_beats_rename_by_default() -> None:
    config = parse(
        """
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
    - {name: gpu, replicas: 2, rename: gpu-shared}
    - {name: nvidia.com/mig-1g.10gb, replicas: 3}
"""
    )
    first, second = config.sharing.active.resources
    assert (first.name, first.rename) == ("nvidia.com/gpu", "nvidia.com/gpu-shared")
    assert (second.name, second.rename) == ("nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.10gb.shared")


def test_one_replica_is_accepted() -> None:
    config = parse("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 1}]}}")
    assert config.sharing.active.resources[0].replicas == 1


def test_devices_count_and_canonical_refs() -> None:
    counted = parse("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: 3}]}}")
    assert counted.sharing.active.resources[0].devices == ReplicatedDevices(all=False, count=3)
    refs = parse(
        "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, "
        "devices: ['007', '01:002', 'GPU-4CF8DB2D-06C0-7D70-1A51-E59B25B2C16C', 7]}]}}"
    )
    assert refs.sharing.active.resources[0].devices.refs == (
        "7",
        "1:2",
        "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",
    )


def test_entries_sharing_a_final_name_with_equal_replicas_are_accepted() -> None:
    config = parse(
        "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, rename: shared}, "
        "{name: mig-1g.10gb, replicas: 2, rename: shared}]}}"
    )
    assert {r.rename for r in config.sharing.active.resources} == {"nvidia.com/shared"}


def test_health_lists_replace_defaults_only_when_non_empty() -> None:
    assert parse("health: {ignoredXIDs: [79]}").health.ignored_xids == frozenset({79})
    assert parse("health: {ignoredXIDs: []}").health.ignored_xids == DEFAULT_IGNORED_XIDS
    assert parse("health: {eventTypes: []}").health.event_types == HEALTH_EVENT_TYPES
    assert parse("health: {criticalXIDs: ALL}").health.critical_xids is None


def test_health_recovery_extension() -> None:
    minutes = parse("health: {recovery: {enabled: true, gracePeriod: 2m}}").health.recovery
    assert (minutes.enabled, minutes.grace_period_seconds) == (True, 120.0)
    recovery = parse("health: {recovery: {gracePeriod: 45}}").health.recovery
    assert (recovery.enabled, recovery.grace_period_seconds) == (False, 45.0)
    assert parse("health: {recovery: {gracePeriod: 1.5}}").health.recovery.grace_period_seconds == 1.5


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("90s", 90.0),
        ("1m30s", 90.0),
        ("1.5h", 5400.0),
        ("300ms", 0.3),
        ("-2s", -2.0),
        ("1h1m1s", 3661.0),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "s", "1x", "1.s5", "m5", " 5s", "."])
def test_not_go_durations(text: str) -> None:
    assert parse_go_duration(text) is None


def test_json_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    doc = {"version": "v1", "flags": {"migStrategy": "single"}, "sharing": {"timeSlicing": {"resources": []}}}
    doc["sharing"]["timeSlicing"]["resources"] = [{"name": "nvidia.com/gpu", "replicas": 3}]  # type: ignore[index]
    path.write_text(json.dumps(doc, indent="\t"))  # tabs: valid JSON that YAML 1.1 refuses
    config = load_config_file(path)
    assert config.flags.mig_strategy == "single"
    assert config.sharing.active.resources[0].replicas == 3


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("version: v1\nflags:\n  migStrategy: [mixed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: invalid YAML at line 4"):
        load_config_file(path)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml: config file not found"):
        load_config_file(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config_file(tmp_path)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"version: v1\n\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config_file(binary)


def test_overrides_replace_file_values_and_errors_name_their_origin() -> None:
    file_doc = {"flags": {"migStrategy": "single", "plugin": {"nvidiaCDIHookPath": "/file/hook"}}}
    config = build_config(
        file_doc,
        {
            "flags.plugin.passDeviceSpecs": Override(True, "flag --pass-device-specs"),
            "flags.plugin.nvidiaCTKPath": Override("/env/ctk", "env NVIDIA_CTK_PATH"),
        },
        "file.yaml",
    )
    assert config.flags.mig_strategy == "single"
    assert config.flags.plugin.pass_device_specs is True
    assert config.flags.plugin.nvidia_ctk_path == "/env/ctk"  # the override beats the file's alias
    assert file_doc["flags"]["plugin"] == {
        "nvidiaCDIHookPath": "/file/hook"
    }  # the caller's document is untouched

    with pytest.raises(ConfigError) as err:
        build_config(None, {"flags.migStrategy": Override("mix", "env MIG_STRATEGY")}, "file.yaml")
    assert (
        str(err.value) == "env MIG_STRATEGY: flags.migStrategy must be one of none, single, mixed, got 'mix'"
    )

    with pytest.raises(ConfigError, match=r"^file\.yaml: flags\.failOnInitError"):
        build_config(
            {"flags": {"failOnInitError": "no"}},
            {"flags.migStrategy": Override("mixed", "env MIG_STRATEGY")},
            "file.yaml",
        )


def test_mps_with_mixed_from_the_environment_blames_the_environment() -> None:
    with pytest.raises(
        ConfigError, match=r"^env MIG_STRATEGY: flags\.migStrategy: 'mixed' cannot be combined"
    ):
        build_config(
            {"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2}]}}},
            {"flags.migStrategy": Override("mixed", "env MIG_STRATEGY")},
            "file.yaml",
        )


def test_qualify_resource_name() -> None:
    assert qualify_resource_name("mig-1g.10gb") == "nvidia.com/mig-1g.10gb"
    assert qualify_resource_name("nvidia.com/gpu") == "nvidia.com/gpu"
    with pytest.raises(ConfigError, match="'Big_GPU' is not a valid resource name"):
        qualify_resource_name("Big_GPU")


def test_parse_config_accepts_decoded_documents_directly() -> None:
    config = parse_config({"flags": {"migStrategy": "mixed"}}, "<api>")
    assert config.flags.mig_strategy == "mixed"
    with pytest.raises(ConfigError, match=r"^<api>: flags\.migStrategy"):
        parse_config({"flags": {"migStrategy": 1}}, "<api>")


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

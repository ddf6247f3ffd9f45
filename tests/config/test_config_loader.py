"""config.loader: the v1 format as NVIDIA documents it, our example files, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvidia_device_plugin.config.loader import load_config_file
from nvidia_device_plugin.config.v1 import Config, ReplicatedDevices, ReplicatedResource, ResourcePattern

from support.configs import CONFIGS, parse

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
flags: {resourceNaming: true}  # else v0.20 ignores every device list (test_config_naming.py)
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

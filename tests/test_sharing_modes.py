"""A sharing mode as one frozen value (config/sharing_modes.py), and the MIG strategy's predicate."""

from __future__ import annotations

import dataclasses

import pytest

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.sharing_modes import (
    MPS,
    MPS_MAX_CLIENTS_PER_GPU,
    NO_SHARING,
    TIME_SLICING,
    SharingModeFacts,
    sharing_mode,
)
from nvidia_device_plugin.config.v1 import (
    MIG_STRATEGIES,
    SHARING_MODES,
    ReplicatedResource,
    ReplicatedResources,
    Sharing,
    advertises_mig_devices,
)


def test_every_mode_the_config_can_name_has_facts() -> None:
    assert [sharing_mode(name).name for name in SHARING_MODES] == list(SHARING_MODES)
    assert {sharing_mode(name) for name in SHARING_MODES} == {NO_SHARING, TIME_SLICING, MPS}


def test_a_name_no_config_can_hold_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"sharing mode 'MPS' is not one of none, time-slicing, mps"):
        sharing_mode("MPS")  # type: ignore[arg-type]


def test_a_mode_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        MPS.needs_control_daemon = False  # type: ignore[misc]


def _sharing(mode: str) -> Sharing:
    resources = ReplicatedResources(resources=(ReplicatedResource(name="nvidia.com/gpu", replicas=2),))
    if mode == "mps":
        return Sharing(mps=resources)
    return Sharing(time_slicing=resources) if mode == "time-slicing" else Sharing()


@pytest.mark.parametrize(
    ("strategy", "facts", "section"),
    [
        ("none", NO_SHARING, ""),
        ("time-slicing", TIME_SLICING, "sharing.timeSlicing"),
        ("mps", MPS, "sharing.mps"),
    ],
)
def test_the_config_strategy_looks_up_its_mode_and_section(
    strategy: str, facts: SharingModeFacts, section: str
) -> None:
    sharing = _sharing(strategy)
    assert sharing.strategy == strategy
    assert sharing_mode(sharing.strategy) is facts
    assert facts.section == section


def test_only_mps_needs_a_control_daemon_and_keeps_a_request_on_one_gpu() -> None:
    assert [m.needs_control_daemon for m in (NO_SHARING, TIME_SLICING, MPS)] == [False, False, True]
    assert [m.one_gpu_per_request for m in (NO_SHARING, TIME_SLICING, MPS)] == [False, False, True]
    assert [m.shares_mig_devices for m in (NO_SHARING, TIME_SLICING, MPS)] == [True, True, False]
    assert [m.replicas_at_most for m in (NO_SHARING, TIME_SLICING, MPS)] == [
        None,
        None,
        MPS_MAX_CLIENTS_PER_GPU,
    ]


def test_time_slicing_and_mps_advertise_replicas() -> None:
    assert [m.shares_devices for m in (NO_SHARING, TIME_SLICING, MPS)] == [False, True, True]


def test_dra_publishes_time_slicing_and_mps_shareable_with_a_class() -> None:
    assert [m.dra_shareable for m in (NO_SHARING, TIME_SLICING, MPS)] == [False, True, True]
    assert [m.dra_attribute for m in (NO_SHARING, TIME_SLICING, MPS)] == ["none", "time-slicing", "mps"]
    assert [m.dra_class for m in (NO_SHARING, TIME_SLICING, MPS)] == [True, True, True]


def test_only_the_none_mig_strategy_advertises_mig_gpus_whole() -> None:
    assert {s: advertises_mig_devices(s) for s in MIG_STRATEGIES} == {
        "none": False,
        "single": True,
        "mixed": True,
    }

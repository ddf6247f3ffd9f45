"""config.flags: NVIDIA's DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS over the health section."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nvidia_device_plugin.config.flags import apply_health_env, resolve_config
from nvidia_device_plugin.config.v1 import DEFAULT_IGNORED_XIDS, Health

from support.checks import assert_all
from support.configs import parse_args

# --------------------------------------------------------------------------------------------------------
# DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS


def health_with(env: dict[str, str], base: Health | None = None) -> Health:
    return apply_health_env(base or Health(), env)


@pytest.mark.parametrize("value", ["all", "ALL", "xids", "48,all", " xids "])
def test_disable_all_or_xids_turns_health_checks_off(value: str) -> None:
    health = health_with({"DP_DISABLE_HEALTHCHECKS": value})
    assert health.disabled is True
    assert not health.is_critical(48)


def test_disable_list_adds_to_the_ignored_set() -> None:
    health = health_with({"DP_DISABLE_HEALTHCHECKS": "48, 79"})
    assert health.disabled is False
    assert health.ignored_xids == DEFAULT_IGNORED_XIDS | {48, 79}
    assert not health.is_critical(48) and not health.is_critical(13) and health.is_critical(94)


def test_disable_list_extends_the_configs_own_list() -> None:
    health = health_with({"DP_DISABLE_HEALTHCHECKS": "48,79"}, Health(ignored_xids=frozenset({13})))
    assert health.ignored_xids == frozenset({13, 48, 79})


def test_malformed_entries_are_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        health = health_with({"DP_DISABLE_HEALTHCHECKS": "48,,invalid,79"})
    assert health.ignored_xids == DEFAULT_IGNORED_XIDS | {48, 79}
    assert "invalid" in caplog.text


def test_enable_list_overrides_the_default_ignored_xids() -> None:
    health = health_with({"DP_ENABLE_HEALTHCHECKS": "13,31"})
    assert health.ignored_xids == DEFAULT_IGNORED_XIDS - {13, 31}
    assert health.is_critical(13) and health.is_critical(31) and not health.is_critical(43)


def test_enable_wins_over_disable_for_the_same_xid() -> None:
    health = health_with({"DP_DISABLE_HEALTHCHECKS": "48,79", "DP_ENABLE_HEALTHCHECKS": "48"})
    assert health.is_critical(48) and not health.is_critical(79)


def test_disable_all_but_the_enabled_ones() -> None:
    health = health_with({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "48,13"})
    assert health.disabled is False
    assert health.is_critical(48) and health.is_critical(13)
    assert not health.is_critical(79) and not health.is_critical(31)


def test_enable_all_makes_every_xid_critical() -> None:
    health = health_with({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "all"})
    assert health.disabled is False
    assert_all([*DEFAULT_IGNORED_XIDS, 48, 79], lambda xid: health.is_critical(xid))


def test_no_health_env_leaves_health_alone() -> None:
    base = Health(ignored_xids=frozenset({1}), critical_xids=frozenset({48}))
    assert health_with({}, base) is base
    assert health_with({"DP_DISABLE_HEALTHCHECKS": ""}, base) is base


def test_resolve_config_applies_health_env_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("health:\n  ignoredXIDs: [13]\n")
    config = resolve_config(parse_args("--config-file", str(path)), {"DP_DISABLE_HEALTHCHECKS": "48"})
    assert config.health.ignored_xids == frozenset({13, 48})

"""The `dra` config section: off by default, `all` or a list of GPUs, flags and env over the file, and
errors that name the field."""

from __future__ import annotations

import argparse

import pytest

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.dra import Dra
from nvidia_device_plugin.config.flags import add_config_arguments, resolve_config
from nvidia_device_plugin.config.loader import parse_config, parse_config_text


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    return parser.parse_args(list(argv))


def test_off_by_default_and_all_gpus_once_on() -> None:
    assert parse_config(None).dra == Dra(enabled=False, gpus="all")
    assert parse_config_text("dra: {enabled: true}").dra == Dra(enabled=True, gpus="all")
    assert parse_config_text("dra: {enabled: true, gpus: ALL}").dra.gpus == "all"


def test_a_list_of_indices_and_uuids_is_read_canonically() -> None:
    config = parse_config_text('dra: {enabled: true, gpus: [0, "07", "GPU-8A3C-11"]}')
    assert config.dra.gpus == ("0", "7", "gpu-8a3c-11")
    assert parse_config_text("dra: {enabled: true, gpus: []}").dra.gpus == ()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("dra: {gpus: [0, 0]}", "dra.gpus: lists GPU 0 twice"),
        ('dra: {gpus: ["0:1"]}', r"dra.gpus\[0\]: DRA owns whole GPUs .* got the MIG device '0:1'"),
        ('dra: {gpus: ["MIG-1234"]}', r"dra.gpus\[0\]: DRA owns whole GPUs"),
        ("dra: {gpus: [a100]}", r"dra.gpus\[0\] must be a GPU index or a GPU UUID, got 'a100'"),
        ("dra: {gpus: some}", "dra.gpus must be 'all' or a list of GPU indices and UUIDs, got 'some'"),
        ("dra: {enabled: yes please}", "dra.enabled must be a boolean"),
        ("dra: {enable: true}", r"dra.enable: unknown field \(did you mean enabled\?\)"),
    ],
)
def test_errors_name_the_field(text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_config_text(text)


def test_flags_and_env_set_the_section_over_the_file(tmp_path: object) -> None:
    assert resolve_config(_args("--dra"), {}).dra == Dra(enabled=True)
    assert resolve_config(_args("--dra=false"), {"NVDP_DRA": "true"}).dra.enabled is False
    assert resolve_config(_args(), {"NVDP_DRA": "1", "NVDP_DRA_GPUS": "0,2"}).dra == Dra(True, ("0", "2"))
    assert resolve_config(_args("--dra-gpus", "all"), {"NVDP_DRA_GPUS": "1"}).dra.gpus == "all"
    with pytest.raises(ConfigError, match=r"flag --dra-gpus: dra.gpus\[0\] must be a GPU index"):
        resolve_config(_args("--dra-gpus", "first"), {})


def test_the_daemon_reads_an_unknown_dra_key_as_a_warning() -> None:
    config = parse_config({"dra": {"enabled": True, "slices": 3}}, strict=False)
    assert config.dra.enabled and config.unknown_keys == ("dra.slices",)

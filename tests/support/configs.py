"""What the config tests feed the loader: the repository's example configs, a config text read as a file
would be, a ConfigMap volume as kubelet mounts it, and the config flags parsed as `run` parses them."""

from __future__ import annotations

import argparse
from pathlib import Path

from nvidia_device_plugin.config.flags import add_config_arguments
from nvidia_device_plugin.config.loader import parse_config_text
from nvidia_device_plugin.config.v1 import Config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"  # the example configs shipped in the repository


def parse(text: str) -> Config:
    """`text` loaded as the config file "test.yaml" (errors name that file)."""
    return parse_config_text(text, "test.yaml")


def configmap_volume(mount: Path, files: dict[str, str]) -> Path:
    """A ConfigMap volume at `mount` as kubelet lays it out: each key a link into `..data`, itself a link to
    a timestamped directory holding the files. Returns `mount`."""
    data = mount / "..2026_12_02_10_00_00.000000001"
    data.mkdir(parents=True)
    for name, text in files.items():
        (data / name).write_text(text)
        (mount / name).symlink_to(Path("..data") / name)
    (mount / "..data").symlink_to(data.name)
    return mount


def parse_args(*argv: str) -> argparse.Namespace:
    """`argv` through the config arguments alone; a bad flag raises argparse.ArgumentError, no exit."""
    parser = argparse.ArgumentParser(prog="nvidia-device-plugin", exit_on_error=False)
    add_config_arguments(parser)
    return parser.parse_args(list(argv))

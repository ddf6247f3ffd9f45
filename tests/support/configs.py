"""What the config tests feed the loader: the repository's example configs, a config text read as a file
would be, and the config flags parsed as `run` parses them."""

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


def parse_args(*argv: str) -> argparse.Namespace:
    """`argv` through the config arguments alone; a bad flag raises argparse.ArgumentError, no exit."""
    parser = argparse.ArgumentParser(prog="nvidia-device-plugin", exit_on_error=False)
    add_config_arguments(parser)
    return parser.parse_args(list(argv))

"""The config flags as `run` parses them: one parser for every test of flags, env vars and the config file."""

from __future__ import annotations

import argparse

from nvidia_device_plugin.config.flags import add_config_arguments


def parse_args(*argv: str) -> argparse.Namespace:
    """`argv` through the config arguments alone; a bad flag raises argparse.ArgumentError, no exit."""
    parser = argparse.ArgumentParser(prog="nvidia-device-plugin", exit_on_error=False)
    add_config_arguments(parser)
    return parser.parse_args(list(argv))

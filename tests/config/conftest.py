from __future__ import annotations

from pathlib import Path

import pytest

# Every `flags` value differs from its default, so a test sees whether the file was read.
FLAGS_FILE = """
version: v1
flags:
  migStrategy: single
  failOnInitError: false
  nvidiaDriverRoot: /file/driver
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: volume-mounts
    deviceIDStrategy: index
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    """A config file (FLAGS_FILE) in tmp_path, for CONFIG_FILE or --config-file."""
    path = tmp_path / "config.yaml"
    path.write_text(FLAGS_FILE)
    return path

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A device-plugin directory for one test. Short, under /tmp: unix socket paths max out near 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix=f"nvdp-{os.getpid()}-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nvidia_device_plugin.nvml.session import NvmlSession


@pytest.fixture
def sessions() -> Iterator[list[NvmlSession]]:
    opened: list[NvmlSession] = []
    yield opened
    for session in opened:
        session.close()

"""A decoy named as the plugin watches every config-manager test (counting only the signals this test process
and its children send): config-manager's default
PROCESS_TO_SIGNAL (`nvidia-device-plugin`) identifies it, so a test that lets config-manager signal the
machine's processes (SEND_SIGNAL on, outside a PID namespace of its own) signals the decoy, and fails, where
it would otherwise signal a developer's running plugin."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nvidia_device_plugin.configmanager.settings import DEFAULT_PROCESS_TO_SIGNAL

from support.signal_targets import signals_recorded, start_session_decoy


@pytest.fixture(scope="module")
def plugin_decoy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A process this module starts, named as the plugin is; the file its SIGHUPs are recorded in."""
    where = tmp_path_factory.mktemp("decoy")
    marker = where / "signals"
    decoy = start_session_decoy(where / DEFAULT_PROCESS_TO_SIGNAL, marker)
    try:
        yield marker
    finally:
        decoy.kill()
        decoy.wait()


@pytest.fixture(autouse=True)
def no_stranger_is_signalled(plugin_decoy: Path) -> Iterator[None]:
    before = signals_recorded(plugin_decoy)
    yield
    stranger = f"a process the test did not start (a decoy named {DEFAULT_PROCESS_TO_SIGNAL})"
    assert signals_recorded(plugin_decoy) == before, f"config-manager signalled {stranger}"

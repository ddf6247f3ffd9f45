from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvidia_device_plugin.daemon import Daemon
from nvidia_device_plugin.kubelet_standin import KubeletStandIn

from daemon_support import GPU, start_daemon


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A device-plugin directory for one test. Short, under /tmp: unix socket paths max out near 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix=f"nvdp-{os.getpid()}-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[KubeletStandIn]:
    """The kubelet side of the protocol, listening on plugin_dir/kubelet.sock."""
    with KubeletStandIn(plugin_dir) as k:
        yield k


@pytest.fixture
def daemon(plugin_dir: Path, kubelet: KubeletStandIn) -> Iterator[Daemon]:
    """The daemon on a simulated dgx-a100, registered with the stand-in."""
    d = start_daemon(plugin_dir)
    assert kubelet.wait_for_resources([GPU])
    yield d
    d.stop()

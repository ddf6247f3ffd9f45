"""The simulator's UUIDs stay byte-identical to `uuid.uuid5` (presets and tests name GPUs by them), and a
simulated node is read without loading hashlib (OpenSSL's `_hashlib`: RSS in every simulated `run`)."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from nvidia_device_plugin.nvml.sim.uuids import name_uuid

from support.waiting import scaled

_NAMESPACE = uuid.UUID("6b1e0c8a-52c3-4f4e-9d0c-0c2d5b7a9e11")


@pytest.mark.parametrize("name", ["dgx-a100/0", "GPU-0e9b2c6a/6", "", "é/ü/7", "x" * 10_000])
def test_name_uuid_is_uuid5(name: str) -> None:
    assert name_uuid(_NAMESPACE, name) == uuid.uuid5(_NAMESPACE, name)


def test_a_simulated_node_is_read_without_hashlib() -> None:
    code = (
        "import sys\n"
        "from nvidia_device_plugin.nvml.sim.node import load_node\n"
        "node = load_node('a100-mig-mixed')\n"
        "assert node.gpus and any(g.mig for g in node.gpus)\n"
        "print(sorted(m for m in ('hashlib', '_hashlib') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(60))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

"""The simulator's UUIDs stay identical to `uuid.uuid5`'s text (presets and tests name GPUs by them), and a
simulated node is read without loading hashlib (OpenSSL's `_hashlib`: RSS in every simulated `run`) or uuid
(which loads platform)."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from nvidia_device_plugin.nvml.sim.uuids import name_uuid

from support.waiting import scaled

_NAMESPACES = (
    "6b1e0c8a-52c3-4f4e-9d0c-0c2d5b7a9e11",
    "3b0c6a52-8f1e-4d59-9a57-6d1f0c2b7e41",
    str(uuid.UUID(int=0)),
)


@pytest.mark.parametrize("namespace", _NAMESPACES)
@pytest.mark.parametrize("name", ["dgx-a100/0", "GPU-0e9b2c6a/6", "", "é/ü/7", "x" * 10_000])
def test_name_uuid_is_uuid5(namespace: str, name: str) -> None:
    assert name_uuid(namespace, name) == str(uuid.uuid5(uuid.UUID(namespace), name))


def test_a_simulated_node_is_read_without_hashlib() -> None:
    code = (
        "import sys\n"
        "from nvidia_device_plugin.nvml.sim.node import load_node\n"
        "node = load_node('a100-mig-mixed')\n"
        "assert node.gpus and any(g.mig for g in node.gpus)\n"
        "print(sorted(m for m in ('hashlib', '_hashlib', 'uuid', 'platform') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(60))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

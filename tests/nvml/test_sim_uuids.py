"""A simulated node is read without loading hashlib (OpenSSL's `_hashlib`: RSS in every simulated `run`) or
uuid (which loads platform): its UUIDs come from base/uuids.py (tests/test_uuids.py holds them to uuid5)."""

from __future__ import annotations

import subprocess
import sys

from support.waiting import scaled


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

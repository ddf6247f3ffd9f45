"""`run --node-config-label`: the daemon picks its config by the node's label and follows it live.

The daemon runs as its own process (`python -m nvidia_device_plugin run --simulate ...`), finds the API
through $KUBECONFIG like kubectl, and talks to the stand-in API server over real HTTP; the kubelet side
is the stand-in over real unix sockets.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU
from support.fake_apiserver import LABEL, NODE, FakeApiServer, write_kubeconfig
from support.waiting import scaled

SHARED_2 = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - {name: nvidia.com/gpu, replicas: 2}\n"
)
WHOLE = "version: v1\n"


def _configmap(tmp_path: Path) -> Path:
    mount = tmp_path / "config"
    mount.mkdir()
    (mount / "shared").write_text(SHARED_2)
    (mount / "default").write_text(WHOLE)
    return mount


def _daemon(tmp_path: Path, plugin_dir: Path, server: FakeApiServer, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.update({"KUBECONFIG": str(write_kubeconfig(tmp_path / "kubeconfig", server.url)), "NODE_NAME": NODE})
    args = [
        sys.executable, "-m", "nvidia_device_plugin", "run", "--simulate", "dgx-a100",
        "--device-plugin-path", str(plugin_dir), "--metrics-address", "",
        "--config-dir", str(_configmap(tmp_path)), "--node-config-label", LABEL, *extra,
    ]  # fmt: skip
    return subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)


def _stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=scaled(30))
    return err


def test_the_label_chooses_the_config_and_a_label_change_reloads_live(
    tmp_path: Path, plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    with FakeApiServer({LABEL: "shared"}) as server:
        process = _daemon(tmp_path, plugin_dir, server)
        try:
            assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 16, timeout=scaled(30))
            server.set_label("default")
            assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8, timeout=scaled(15))
            server.set_label(None)  # unlabelled: NVIDIA's fallback `named` takes the key "default"
            server.set_label("shared")
            assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 16, timeout=scaled(15))
        finally:
            err = _stop(process)
    assert process.returncode == 0, err
    assert f"{LABEL}=default" in err
    # The daemon stopped its follower: the watch being read was ended, not waited out (up to 5 minutes).
    assert f"stopped following label {LABEL} of node {NODE}" in err
    assert "did not stop" not in err


def test_a_label_naming_no_config_stops_the_start_with_a_clear_error(
    tmp_path: Path, plugin_dir: Path
) -> None:
    with FakeApiServer({LABEL: "h100-special"}) as server:
        process = _daemon(tmp_path, plugin_dir, server)
        _, err = process.communicate(timeout=scaled(60))
    assert process.returncode == 1
    assert f"{LABEL}=h100-special names no config (available: default, shared)" in err

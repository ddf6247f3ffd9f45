"""The dependencies' floor the bench reports beside the bare server (bench/echo_server.py `--floor`): it
serves like the bare server, and it carries the dependencies it names and none of the plugin's own code,
so the gap between the floor and the daemon is the plugin's code alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.waiting import scaled

REPO_ROOT = Path(__file__).resolve().parents[2]
# What the server itself imports of the package: the generated stubs and the message limits.
SERVER_MODULES = {
    "nvidia_device_plugin",
    "nvidia_device_plugin.api",
    "nvidia_device_plugin.api.v1beta1",
    "nvidia_device_plugin.api.v1beta1.api_pb2",
    "nvidia_device_plugin.api.v1beta1.api_pb2_grpc",
    "nvidia_device_plugin.base",
    "nvidia_device_plugin.base.errors",
    "nvidia_device_plugin.plugin",
    "nvidia_device_plugin.plugin.protocol",
}
# In a child, after the floor ran: its observers, the modules loaded, and an Allocate answered by the server.
PROBE = """
import json, sys
import grpc
import bench.echo_server as echo
from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb, api_pb2_grpc as pb_grpc
server = echo.serve(sys.argv[1])
echo.floor(sys.argv[1], sys.argv[2] == "config")
observers = echo.floor_watches(sys.argv[1], sys.argv[2] == "config")
with grpc.insecure_channel("unix:" + sys.argv[1]) as channel:
    answer = pb_grpc.DevicePluginStub(channel).Allocate(pb.AllocateRequest(), timeout=10)
answered = answer == pb.AllocateResponse()
alive = [o.is_alive() for o in observers]
for o in observers:
    o.stop()
server.stop(0).wait()
print(json.dumps({"alive": alive, "answered": answered, "modules": sorted(sys.modules)}))
"""


def floor_in_child(tmp_path: Path, mode: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "floor.sock"), mode],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize(("mode", "watches", "loads_yaml"), [("deps", 1, False), ("config", 2, True)])
def test_floor_carries_the_dependencies_and_none_of_the_plugin(
    tmp_path: Path, mode: str, watches: int, loads_yaml: bool
) -> None:
    result = floor_in_child(tmp_path, mode)
    modules = set(result["modules"])  # type: ignore[call-overload]
    assert result["answered"] is True
    assert result["alive"] == [True] * watches
    assert {"pynvml", "ctypes", "argparse", "dataclasses", "watchdog.observers"} <= modules
    assert ("yaml" in modules) is loads_yaml
    assert {m for m in modules if m.startswith("nvidia_device_plugin")} == SERVER_MODULES


def test_floor_mode_is_checked(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.echo_server", "--floor=warp", str(tmp_path / "s.sock")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert done.returncode == 2
    assert "usage: python -m bench.echo_server [--floor | --floor=config] SOCKET" in done.stderr

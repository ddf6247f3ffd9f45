"""Per-claim sharing through a real `run --simulate dgx-a100 --dra` process: the daemon gives its kubelet
plugin the node's time-slices (the simulator's under --simulate), the MPS root of its config and the
compute-mode hooks, so that a claim whose opaque config asks for TimeSlicing gets the GPU's time-slice set,
and one asking for MPS gets a control daemon (the fake nvidia-cuda-mps-control of tests/sharing, found on
the daemon's PATH as the real one is) started before the claim is answered and quit at Unprepare.

The simulator's time-slices live in the daemon process; it keeps a copy in its host tree (nvml/sim/state.py
TIME_SLICES_FILE), which the test finds under the TMPDIR it gives the daemon. A restarted daemon adopts a
prepared MPS claim's control daemon. Only processes this test started (the daemon) or the fake control
binary started (by their ids) are ever signalled."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nvidia_device_plugin.dra.kubelet.cdispec import claim_spec_file
from nvidia_device_plugin.dra.names import DRIVER_NAME
from nvidia_device_plugin.nvml.sim.node import load_node
from nvidia_device_plugin.nvml.sim.state import TIME_SLICES_FILE
from nvidia_device_plugin.sharing.mps_processes import pid_alive, running_pid
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.dra_daemon import DraApiServer, daemon_output, start_dra_daemon, stop_daemon
from support.dra_kubelet import DraKubeletStandIn, resource_claim
from support.fake_mps import install_fake_control, kill_fake_daemons, lines
from support.podresources_standin import PodResourcesStandIn
from support.waiting import wait_for

PRESET = "dgx-a100"
UUIDS = [g.uuid for g in sorted(load_node(PRESET).gpus, key=lambda g: g.index)]
SLICED_UID = "0f3c6b1e-3333-4a5e-9d7e-000000000029"
MPS_UID = "0f3c6b1e-4444-4a5e-9d7e-000000000029"
API = "resource.nvidia.com/v1beta1"


@dataclass
class Node:
    """One test's node under the `plugin_dir` fixture's short /tmp path: the stand-ins, the fake MPS
    control binary, and the daemon process started on it."""

    root: Path
    dra: DraKubeletStandIn
    api: DraApiServer
    pods: PodResourcesStandIn
    processes: list[tuple[subprocess.Popen[str], Path]] = field(default_factory=list)

    @property
    def mps_root(self) -> Path:
        return self.root / "mps"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def start(self) -> subprocess.Popen[str]:
        """`run --dra` for GPUs 0 and 1, with the fake control binary first on its PATH."""
        bin_dir = self.root / "bin"
        bin_dir.mkdir(exist_ok=True)
        install_fake_control(bin_dir)
        self.tmp.mkdir(exist_ok=True)
        log = self.root / f"daemon-{len(self.processes)}.log"
        flags = [
            "--mps-root",
            str(self.mps_root),
            "--dra-handover-interval",
            "0.02",
            "--dra",
            "--dra-gpus",
            "0,1",
        ]
        env = {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "TMPDIR": str(self.tmp),  # the simulated host tree (and its time-slices file) goes here
        }
        process = start_dra_daemon(self.root, self.api, self.pods, log, PRESET, *flags, env=env)
        self.processes.append((process, log))
        return process

    def stop(self, process: subprocess.Popen[str]) -> str:
        return stop_daemon(self.processes, process)

    def output(self, process: subprocess.Popen[str]) -> str:
        return daemon_output(self.processes, process)

    def time_slices(self) -> dict[str, str]:
        """GPU UUID -> its time-slice, as the daemon's simulated node holds it now."""
        (path,) = self.tmp.glob(f"nvdp-host-*/{TIME_SLICES_FILE}")
        slices: dict[str, str] = json.loads(path.read_text())
        return slices

    def put(self, uid: str, name: str, device: str, sharing: dict[str, Any]) -> None:
        parameters = {"apiVersion": API, "kind": "GpuConfig", "sharing": sharing}
        config = {"source": "FromClaim", "opaque": {"driver": DRIVER_NAME, "parameters": parameters}}
        self.api.claims.put(resource_claim(uid, name=name, results=[("gpu", device)], config=[config]))

    def prepare(self, claim: tuple[str, str, str]) -> None:
        answer = self.dra.prepare([claim])[claim[2]]
        assert answer.error == "", answer.error

    def unprepare(self, claim: tuple[str, str, str]) -> None:
        assert self.dra.unprepare([claim])[claim[2]].error == ""

    def claim_env(self, uid: str) -> list[str]:
        spec = json.loads((self.root / "cdi" / claim_spec_file(uid)).read_text())
        env: list[str] = spec["containerEdits"].get("env", [])
        return env


@pytest.fixture
def node(plugin_dir: Path, kubelet: KubeletStandIn) -> Iterator[Node]:
    (plugin_dir / "pod-resources").mkdir()  # apart: kubelet clears the device-plugin dir of unknown sockets
    pods = PodResourcesStandIn(plugin_dir / "pod-resources" / "kubelet.sock")
    api = DraApiServer()
    with api, pods, DraKubeletStandIn(plugin_dir / "plugins_registry") as dra:
        setup = Node(plugin_dir, dra, api, pods)
        try:
            yield setup
        finally:
            for process, log in setup.processes:
                if process.poll() is None:
                    process.kill()
                    process.wait(30)
                print(f"---- {log.name} (exit {process.returncode})\n{log.read_text()}")  # shown on failure
            kill_fake_daemons(plugin_dir)


def test_the_daemon_sets_a_claims_time_slice_and_runs_an_mps_claims_control_daemon(node: Node) -> None:
    process = node.start()
    node.dra.current(node.root / "plugins_registry" / "gpu.nvidia.com-reg.sock")
    wait_for(lambda: {"gpu-0", "gpu-1"} <= set(node.api.devices()), "GPUs 0 and 1 published for DRA")
    assert node.time_slices() == dict.fromkeys(UUIDS, "Default")

    sliced = ("default", "sliced", SLICED_UID)
    node.put(
        SLICED_UID, "sliced", "gpu-1", {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    )
    node.prepare(sliced)
    assert node.time_slices() == {**dict.fromkeys(UUIDS, "Default"), UUIDS[1]: "Long"}
    node.unprepare(sliced)

    shared = ("default", "shared", MPS_UID)
    node.put(
        MPS_UID, "shared", "gpu-0", {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}
    )
    node.prepare(shared)  # answered only once the claim's control daemon is ready
    pipe = node.mps_root / "claims" / MPS_UID / "pipe"
    pid = running_pid(str(pipe))
    assert pid is not None and pid_alive(pid)
    assert lines(pipe / "launches") == ["-d"]
    assert f"CUDA_MPS_PIPE_DIRECTORY=/mps/claims/{MPS_UID}/pipe" in node.claim_env(MPS_UID)
    assert f"GPU {UUIDS[0]} compute mode set to EXCLUSIVE_PROCESS" in node.output(process)

    node.unprepare(shared)
    assert not pid_alive(pid) and not pipe.parent.exists()  # quit, and its directories gone with it
    wait_for(
        lambda: f"GPU {UUIDS[0]} compute mode set to DEFAULT" in node.output(process),
        "the GPU's compute mode set back",
    )
    node.stop(process)


def test_a_restarted_daemon_adopts_a_prepared_mps_claims_control_daemon_and_quits_it_at_unprepare(
    node: Node,
) -> None:
    shared = ("default", "shared", MPS_UID)
    node.put(MPS_UID, "shared", "gpu-0", {"strategy": "MPS"})
    first = node.start()
    node.dra.current(node.root / "plugins_registry" / "gpu.nvidia.com-reg.sock")
    wait_for(lambda: {"gpu-0", "gpu-1"} <= set(node.api.devices()), "GPUs 0 and 1 published for DRA")
    node.prepare(shared)
    pipe = node.mps_root / "claims" / MPS_UID / "pipe"
    pid = running_pid(str(pipe))
    assert pid is not None
    node.stop(first)
    assert pid_alive(pid)  # SIGTERM leaves the claim's daemon running for its clients

    second = node.start()
    node.dra.current(node.root / "plugins_registry" / "gpu.nvidia.com-reg.sock")
    node.prepare(shared)  # from the checkpoint: the same daemon, not a second
    assert running_pid(str(pipe)) == pid and lines(pipe / "launches") == ["-d"]
    wait_for(lambda: f"already running (pid {pid}); adopting it" in node.output(second), "the adoption")
    node.unprepare(shared)
    assert not pid_alive(pid) and not pipe.parent.exists()
    node.stop(second)

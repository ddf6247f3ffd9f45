"""Dynamic MIG in the `run` daemon (a process of its own, on a100-mig-dynamic): Prepare makes the claim's
MIG device through the daemon's NVML session and the published placement gets its UUID at once (the GPU
read again, not at the next reload); Unprepare destroys it and the placement is published unmade again."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvidia_device_plugin.dra.kubelet.cdispec import claim_spec_file
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.dra_daemon import DraApiServer, published_uuid, start_dra_daemon
from support.dra_kubelet import DraKubeletStandIn, resource_claim
from support.podresources_standin import PodResourcesStandIn
from support.waiting import wait_for

UID = "0f3c6b1e-3333-4a5e-9d7e-000000000031"
CLAIM = ("default", "mig-claim", UID)
DEVICE = "gpu-0-mig-1g10gb-19-6"  # 1g.10gb at slice 6 of GPU 0 (minor 0)


@pytest.fixture
def api() -> Iterator[DraApiServer]:
    with DraApiServer() as server:
        yield server


def _start(root: Path, api: DraApiServer, pods: PodResourcesStandIn, log: Path) -> subprocess.Popen[str]:
    return start_dra_daemon(root, api, pods, log, "a100-mig-dynamic", "--dra", "--dra-dynamic-mig")


def test_the_daemon_makes_the_claims_mig_device_and_publishes_it_at_once(
    plugin_dir: Path, kubelet: KubeletStandIn, api: DraApiServer
) -> None:
    (plugin_dir / "pod-resources").mkdir()
    log = plugin_dir / "daemon.log"
    with (
        PodResourcesStandIn(plugin_dir / "pod-resources" / "kubelet.sock") as pods,
        DraKubeletStandIn(plugin_dir / "plugins_registry") as dra,
    ):
        process = _start(plugin_dir, api, pods, log)
        try:
            wait_for(lambda: published_uuid(api, DEVICE) == "", "the placement to be published, unmade")
            api.claims.put(resource_claim(UID, name="mig-claim", results=[("mig", DEVICE)]))
            answer = dra.prepare([CLAIM])[UID]
            assert answer.error == "", answer.error
            assert (plugin_dir / "cdi" / claim_spec_file(UID)).exists()
            wait_for(lambda: (published_uuid(api, DEVICE) or "").startswith("MIG-"), "the made device's UUID")
            assert dra.unprepare([CLAIM])[UID].error == ""
            wait_for(lambda: published_uuid(api, DEVICE) == "", "the placement published unmade again")
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(30)
            print(log.read_text())  # shown on failure

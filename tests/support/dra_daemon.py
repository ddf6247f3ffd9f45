"""A `run --dra` daemon in a process of its own, for the DRA tests that need one: the API server it talks to
(the slices stand-in, which also serves ResourceClaims) and the command line and environment that put every
path of the DRA mode under one test's root."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from support.fake_apiserver import NODE, FakeResourceSliceApi, ResourceClaims, write_kubeconfig
from support.podresources_standin import PodResourcesStandIn


class DraApiServer(FakeResourceSliceApi):
    """The one API server the daemon talks to: the slices stand-in, which also serves ResourceClaims."""

    def __init__(self) -> None:
        super().__init__()
        self.claims = ResourceClaims()

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        if method == "GET" and (answer := self.claims.answer(path)) is not None:
            return answer
        return super().handle(method, path, query, body)


def start_dra_daemon(
    root: Path,
    api: DraApiServer,
    pods: PodResourcesStandIn,
    log: Path,
    preset: str,
    *flags: str,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[str]:
    """`run --simulate <preset>` with its sockets, CDI specs (`root`/cdi) and kubelet dirs under `root`, its
    output in `log`, `flags` added and `env` over this process's environment."""
    args = [
        "run", "--simulate", preset, "--device-plugin-path", str(root), "--metrics-address", "",
        "--node-name", NODE, "--cdi-spec-dir", str(root / "cdi"), "--pod-resources-socket", str(pods.socket),
        "--kubelet-plugins-dir", str(root / "plugins"),
        "--kubelet-registry-dir", str(root / "plugins_registry"), *flags,
    ]  # fmt: skip
    environment = {**os.environ, **(env or {})}
    environment["KUBECONFIG"] = str(write_kubeconfig(root / "kubeconfig", api.url))
    environment.pop("KUBERNETES_SERVICE_HOST", None)  # the kubeconfig, never an in-cluster service account
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "nvidia_device_plugin", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=environment,
        )


Started = list[tuple[subprocess.Popen[str], Path]]  # the daemon processes a test started, with their logs


def daemon_output(started: Started, process: subprocess.Popen[str]) -> str:
    return next(log.read_text() for p, log in started if p is process)


def stop_daemon(started: Started, process: subprocess.Popen[str]) -> str:
    """SIGTERM, as kubelet stops the pod; the process's output once it exited cleanly."""
    process.send_signal(signal.SIGTERM)
    code = process.wait(30)
    output = daemon_output(started, process)
    assert code == 0, output
    return output


def published_uuid(api: DraApiServer, device: str) -> str | None:
    """The uuid attribute `device` is published with ("" for a dynamic-MIG placement not made); None while it
    is not in the current slices (a pool generation is written slice by slice)."""
    published = api.devices().get(device)
    if published is None:
        return None
    uuid: str = published["attributes"].get("uuid", {}).get("string", "")
    return uuid

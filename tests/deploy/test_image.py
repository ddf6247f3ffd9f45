"""The built image, run by a real engine (podman with runc) under the DaemonSet's security context, against
the kubelet stand-in on a host directory. Run by `make image-test` (image/image-test.sh), which builds the
image and names it in NVDP_IMAGE_UNDER_TEST; without that variable every test here is skipped.

The container gets what the chart's `base` preset gives the plugin container (manifests/base): its args, env,
security context (every capability dropped, read-only root, no privilege escalation, the chart's user), the
device-plugin hostPath (here a directory under /tmp) and the /tmp emptyDir; plus --simulate (no GPU) and no
network at all (kubelet talks to the plugin over the unix sockets only). The `node-labels` preset's
config-manager init container runs too, as that preset says (UID 65534), against a stand-in API server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nvidia_device_plugin import __version__
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.fake_apiserver import LABEL, FakeApiServer, write_kubeconfig
from support.kubelet_standin import kubelet_standin
from support.waiting import scaled

IMAGE = os.environ.get("NVDP_IMAGE_UNDER_TEST", "")
RUNTIME = os.environ.get("NVDP_IMAGE_RUNTIME", "runc")
REPORT = os.environ.get("NVDP_IMAGE_TEST_REPORT", "")
ROOT = Path(__file__).resolve().parents[2]
RENDERED = ROOT / "manifests" / "base" / "nvidia-device-plugin.yaml"
NODE_LABELS = ROOT / "manifests" / "overlays" / "node-labels" / "nvidia-device-plugin.yaml"
PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
NODE = "gpu-node-1"
# Without CAP_SYS_RESOURCE the runtime cannot raise a limit above the engine's own; podman's defaults are
# higher than this host's, so the container gets limits the host has.
ULIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]

pytestmark = pytest.mark.skipif(
    not IMAGE, reason="run by `make image-test` (NVDP_IMAGE_UNDER_TEST names the image)"
)


def _podman(*args: str, timeout: float = scaled(60), check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        pytest.fail(f"podman {' '.join(args[:3])} ... failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _manifest(rendered: Path = RENDERED) -> dict[str, Any]:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered.read_text()) if d}
    return docs


def _daemonset_pod() -> dict[str, Any]:
    pod: dict[str, Any] = _manifest()[("DaemonSet", "nvidia-device-plugin")]["spec"]["template"]["spec"]
    return pod


def security_flags(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """podman flags for a Kubernetes pod and container securityContext (the fields the chart sets)."""
    context = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    assert not context.get("privileged"), "the image test runs unprivileged containers only"
    flags = []
    for capability in context.get("capabilities", {}).get("drop", []):
        flags += ["--cap-drop", capability]
    for capability in context.get("capabilities", {}).get("add", []):
        flags += ["--cap-add", capability]
    if context.get("readOnlyRootFilesystem"):
        flags += ["--read-only", "--read-only-tmpfs=false"]
    if context.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    if "runAsUser" in context:
        flags += ["--user", f"{context['runAsUser']}:{context.get('runAsGroup', context['runAsUser'])}"]
    assert context.get("seccompProfile", {"type": "RuntimeDefault"}) == {"type": "RuntimeDefault"}
    return flags  # podman's default seccomp profile is RuntimeDefault


def _env(container: dict[str, Any]) -> list[str]:
    flags = []
    for entry in container.get("env", []):
        flags += ["--env", f"{entry['name']}={entry.get('value', NODE)}"]  # NODE: a fieldRef spec.nodeName
    return flags


class Running:
    def __init__(self, kubelet: KubeletStandIn, name: str, started: float, config_dir: Path) -> None:
        self.kubelet = kubelet
        self.name = name
        self.started = started
        self.config_dir = config_dir
        self.measured: dict[str, float] = {}

    def logs(self) -> str:
        done = _podman("logs", self.name, check=False)
        return done.stdout + done.stderr


def _report(name: str, value: float) -> None:
    if REPORT:
        path = Path(REPORT)
        measured = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**measured, name: round(value, 3)}, indent=2))


@pytest.fixture(scope="module")
def plugin() -> Iterator[Running]:
    pod = _daemonset_pod()
    [container] = [c for c in pod["containers"] if c["name"] == "nvidia-device-plugin-ctr"]
    [config_map] = [d for (kind, _), d in _manifest().items() if kind == "ConfigMap"]
    work = Path(tempfile.mkdtemp(prefix="nvdp-image-", dir="/tmp"))
    config_dir = work / "available-configs"
    config_dir.mkdir()
    for key, text in config_map["data"].items():
        (config_dir / key).write_text(text)
    plugin_dir = work / "device-plugins"
    name = f"nvdp-image-test-{uuid.uuid4().hex[:8]}"
    kubelet = kubelet_standin(plugin_dir)
    kubelet.start()
    command = [
        *["run", "--detach", "--name", name, "--runtime", RUNTIME, "--network", "none", *ULIMITS],
        *security_flags(pod, container),
        *["--volume", f"{plugin_dir}:{PLUGIN_DIR}", "--volume", f"{config_dir}:/available-configs:ro"],
        *["--tmpfs", "/tmp:rw,size=16m,mode=1777"],
        *_env(container),
        *[
            "--env",
            "NVDP_SIMULATE=dgx-a100",
            "--entrypoint",
            container["command"][0],
            IMAGE,
            *container["args"],
        ],
    ]
    started = time.monotonic()
    _podman(*command)
    running = Running(kubelet, name, started, config_dir)
    try:
        yield running
    finally:
        _podman("rm", "--force", "--time", "0", name, check=False)
        kubelet.stop()
        shutil.rmtree(work, ignore_errors=True)


def _wait(plugin: Running, condition: Any, what: str, timeout: float = scaled(60)) -> float:
    """Seconds until `condition` held; a failure names `what` and shows the container's log."""
    since = time.monotonic()
    if not plugin.kubelet.wait_for(condition, timeout):
        pytest.fail(f"the container never {what} within {timeout:.0f} s; its log:\n{plugin.logs()}")
    return time.monotonic() - since


# Every module in /opt/venv/lib and its .pyc: unchecked-hash bytecode (header flags 1: hash-based, the source
# never checked), so no start on the read-only root compiles anything. Prints the count of modules, then
# those without such a .pyc (none, or a timestamp .pyc from the builder's own runs).
_BYTECODE_CHECK = """
import importlib.util, pathlib, sys
modules = sorted(pathlib.Path(sys.prefix, "lib").rglob("*.py"))
cached = [pathlib.Path(importlib.util.cache_from_source(str(m))) for m in modules]
unchecked_hash = b"\\1\\0\\0\\0"
bad = [str(m) for m, c in zip(modules, cached) if not c.is_file() or c.read_bytes()[4:8] != unchecked_hash]
print(len(modules), *bad)
"""
# Every dataclass `run` makes on its way to serving gets its methods from the image's cache
# (base/dataclass_code.py), written by the build for the image's own Python: prints how many of the
# package's modules were imported, then each one that compiled a method (none).
_DATACLASS_CACHE_CHECK = """
import sys
import nvidia_device_plugin.cli.main, nvidia_device_plugin.cli.run, nvidia_device_plugin.daemons.run
import nvidia_device_plugin.nvml.session, nvidia_device_plugin.nvml.discovery, nvidia_device_plugin.snapshot
from nvidia_device_plugin.base.dataclass_code import compiled
print(sum(m.startswith("nvidia_device_plugin.") for m in sys.modules), *sorted(compiled()))
"""


def test_the_image_is_this_version_with_no_build_tools_left() -> None:
    labels = json.loads(_podman("image", "inspect", "--format", "{{json .Labels}}", IMAGE).stdout)
    assert labels["org.opencontainers.image.version"] == labels["version"] == __version__
    for key in ("name", "vendor", "release", "summary", "description", "maintainer", "io.k8s.description"):
        assert labels.get(key), f"no {key} label (OpenShift reads it)"
    script = (
        "ls /opt/venv/lib/python3*/site-packages | grep -i -E '^(pip|setuptools|wheel)([-_.]|$)' || true; "
        "nvidia-device-plugin --version; "
        "command -v config-manager; command -v gpu-feature-discovery; command -v lsmod"
    )
    done = _podman(
        "run",
        "--rm",
        "--runtime",
        RUNTIME,
        *ULIMITS,
        "--network",
        "none",
        "--entrypoint",
        "sh",
        IMAGE,
        "-c",
        script,
    )
    assert done.stdout.startswith("nvidia-device-plugin "), f"build tools in /opt/venv: {done.stdout}"
    assert f"nvidia-device-plugin {__version__}" in done.stdout
    assert (
        "/opt/venv/bin/config-manager" in done.stdout and "/opt/venv/bin/gpu-feature-discovery" in done.stdout
    )
    assert "/lsmod" in done.stdout, "no lsmod (kmod): the GPU Operator's entrypoint runs it"
    run = ("run", "--rm", "--runtime", RUNTIME, *ULIMITS, "--network", "none", "--read-only")
    modules, *uncompiled = _podman(
        *run, "--entrypoint", "python3", IMAGE, "-c", _BYTECODE_CHECK
    ).stdout.split()
    assert int(modules) > 1000 and not uncompiled, f"without unchecked-hash bytecode: {uncompiled[:10]}"
    imported, *compiling = _podman(
        *run, "--entrypoint", "python3", IMAGE, "-c", _DATACLASS_CACHE_CHECK
    ).stdout.split()
    assert int(imported) > 50 and not compiling, f"dataclass methods compiled at start: {compiling}"
    history = _podman("history", "--no-trunc", "--format", "{{.CreatedBy}}", IMAGE).stdout
    assert "PIP_CA_BUNDLE" not in history and "PIP_INDEX" not in history, (
        "build-only arguments reached the image"
    )
    _report("image_bytes", float(_podman("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout))


def test_registers_with_kubelet(plugin: Running) -> None:
    _wait(plugin, lambda: plugin.kubelet.registrations, "registered with the kubelet stand-in")
    registered = time.monotonic() - plugin.started
    [request] = plugin.kubelet.registrations
    assert (request.resource_name, request.version) == ("nvidia.com/gpu", "v1beta1")
    plugin.measured["registered"] = registered
    _report("start_to_registered_s", registered)


def test_devices_are_healthy(plugin: Running) -> None:
    _wait(plugin, lambda: len(plugin.kubelet.devices("nvidia.com/gpu")) == 8, "advertised 8 GPUs")
    assert {d.health for d in plugin.kubelet.devices("nvidia.com/gpu").values()} == {"Healthy"}


def test_an_admitted_pod_gets_its_gpus(plugin: Running) -> None:
    chosen, answer = plugin.kubelet.admit("nvidia.com/gpu", 2)
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(chosen)


def test_a_kubelet_restart_is_followed_by_a_new_registration(plugin: Running) -> None:
    before = len(plugin.kubelet.registrations)
    plugin.kubelet.restart()
    took = _wait(
        plugin,
        lambda: (
            len(plugin.kubelet.registrations) > before and len(plugin.kubelet.devices("nvidia.com/gpu")) == 8
        ),
        "registered again after the kubelet restart",
    )
    _report("kubelet_restart_to_registered_s", took)


def test_sigterm_stops_it_within_the_grace_period(plugin: Running) -> None:
    grace = _daemonset_pod()["terminationGracePeriodSeconds"]
    since = time.monotonic()
    _podman("kill", "--signal", "TERM", plugin.name)
    done = _podman("wait", plugin.name, timeout=grace + 10, check=False)
    took = time.monotonic() - since
    assert done.returncode == 0 and done.stdout.strip() == "0", (
        f"exit {done.stdout.strip()}:\n{plugin.logs()}"
    )
    assert took < grace, f"took {took:.1f} s, grace period {grace} s"
    left = sorted(p.name for p in plugin.kubelet.plugin_dir.iterdir() if p.name != "kubelet.sock")
    assert left == [], f"the plugin left {left} in the device-plugin directory"
    _report("sigterm_to_exit_s", took)


def test_config_manager_runs_as_the_chart_says_and_links_the_labelled_config(tmp_path: Path) -> None:
    """The node-labels preset's config-manager init container: UID 65534, no capabilities, read-only root."""
    pod = _manifest(NODE_LABELS)[("DaemonSet", "nvidia-device-plugin")]["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    assert init["securityContext"]["runAsUser"] == 65534
    configs, link = tmp_path / "available-configs", tmp_path / "config"
    configs.mkdir()
    link.mkdir(mode=0o777)
    link.chmod(0o777)  # an emptyDir is world-writable
    for key in ("default", "time-slicing"):
        (configs / key).write_text("version: v1\n")
    with FakeApiServer({LABEL: "time-slicing"}) as api:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        kubeconfig.chmod(0o644)
        done = _podman(
            *["run", "--rm", "--runtime", RUNTIME, "--network", "host", *ULIMITS],
            *security_flags(pod, init),
            *["--volume", f"{configs}:/available-configs:ro", "--volume", f"{link}:/config"],
            *["--volume", f"{kubeconfig}:/kube/config:ro"],
            *_env(init),
            *["--entrypoint", init["command"][0], IMAGE, "--kubeconfig=/kube/config"],
            timeout=scaled(120),
            check=False,
        )
    assert done.returncode == 0, f"config-manager in the image: {done.stdout}{done.stderr}"
    assert os.readlink(link / "config.yaml") == "/available-configs/time-slicing"
    assert (link / "config.yaml").lstat().st_uid == 65534

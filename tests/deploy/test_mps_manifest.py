"""The mps overlay's MPS control daemon, rendered by the real `kubectl kustomize`: schema, agreement with
the CLI and the plugin's config, least rights."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from nvidia_device_plugin.cli.main import build_parser
from nvidia_device_plugin.config.loader import parse_config_text

from support.waiting import scaled

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "manifests" / "overlays" / "mps"
KUBERNETES_VERSION = (
    "1.37.0"  # the newest schema kubernetes-validate knows, as tests/deploy/test_manifests.py
)
CONTROL = "nvidia-device-plugin-mps-control-daemon"
PLUGIN = "nvidia-device-plugin"


def _rendered() -> list[dict[str, Any]]:
    kubectl = Path(sys.executable).parent / "kubectl"
    built = subprocess.run(
        [str(kubectl), "kustomize", str(OVERLAY)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return [doc for doc in yaml.safe_load_all(built.stdout) if doc]


def _daemonsets() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _rendered() if d["kind"] == "DaemonSet"}


def _pod(name: str = CONTROL) -> dict[str, Any]:
    pod: dict[str, Any] = _daemonsets()[name]["spec"]["template"]["spec"]
    return pod


def test_the_control_daemon_validates_against_the_kubernetes_schema() -> None:
    try:
        kubernetes_validate.validate(_daemonsets()[CONTROL], KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{CONTROL} at {'.'.join(str(p) for p in exc.path)}: {exc.message}")


def test_both_daemons_read_the_same_mps_config() -> None:
    [container] = _pod()["containers"]
    args = build_parser({}).parse_args(container["args"])
    assert args.command == "mps-control-daemon"
    [plugin] = _pod(PLUGIN)["containers"]
    plugin_args = build_parser({}).parse_args(plugin["args"])
    assert (args.config_dir, args.config_default) == (plugin_args.config_dir, plugin_args.config_default)
    [configmap] = [d for d in _rendered() if d["kind"] == "ConfigMap"]
    text = configmap["data"][args.config_default]
    assert text.strip() == (ROOT / "configs" / "mps.yaml").read_text().strip()
    config = parse_config_text(text)
    assert config.sharing.strategy == "mps"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in _pod()["volumes"]}
    root = config.flags.mps_root
    assert volumes[mounts[root]]["hostPath"]["path"] == root  # the same path inside and on the host
    assert volumes[mounts["/dev/shm"]]["hostPath"]["path"] == f"{root}/shm"
    assert volumes[mounts[args.config_dir]]["configMap"]["name"] == configmap["metadata"]["name"]


def test_it_has_what_mps_needs_and_nothing_more() -> None:
    pod = _pod()
    assert pod["hostPID"] is True
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert pod["automountServiceAccountToken"] is False
    [container] = pod["containers"]
    context = container["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert "/var/lib/kubelet/device-plugins" not in {m["mountPath"] for m in container["volumeMounts"]}
    assert not _pod(PLUGIN).get("hostPID"), "the plugin itself needs no host PID namespace"

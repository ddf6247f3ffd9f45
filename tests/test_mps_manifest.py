"""The MPS control daemon's DaemonSet: schema, agreement with the CLI and config, least rights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from nvidia_device_plugin.cli import build_parser
from nvidia_device_plugin.config.loader import parse_config_text

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "manifests" / "mps-control-daemon" / "mps-control-daemon.yaml"
KUBERNETES_VERSION = "1.32.0"  # as tests/test_manifests.py


def _documents() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc}


def _pod() -> dict[str, Any]:
    pod: dict[str, Any] = _documents()["DaemonSet"]["spec"]["template"]["spec"]
    return pod


@pytest.mark.parametrize("kind", ["ConfigMap", "DaemonSet"])
def test_validates_against_kubernetes_schema(kind: str) -> None:
    doc = _documents()[kind]
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{kind} at {'.'.join(str(p) for p in exc.path)}: {exc.message}")


def test_args_are_the_cli_command_and_the_config_is_mps() -> None:
    [container] = _pod()["containers"]
    args = build_parser({}).parse_args(container["args"])
    assert args.command == "mps-control-daemon"
    assert args.config_dir == "/config"
    text = _documents()["ConfigMap"]["data"][args.config_default]
    assert text.strip() == (ROOT / "configs" / "mps.yaml").read_text().strip()
    config = parse_config_text(text)
    assert config.sharing.strategy == "mps"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in _pod()["volumes"]}
    root = config.flags.mps_root
    assert volumes[mounts[root]]["hostPath"]["path"] == root  # the same path inside and on the host
    assert volumes[mounts["/dev/shm"]]["hostPath"]["path"] == f"{root}/shm"
    sources = {s["configMap"]["name"] for s in volumes[mounts["/config"]]["projected"]["sources"]}
    assert _documents()["ConfigMap"]["metadata"]["name"] in sources


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

"""The labels overlay: renders (validated with the other overlays in test_manifests.py), mounts NFD's
features.d host directory where --labels-file points, and names variables the CLI reads."""

from __future__ import annotations

from pathlib import PurePosixPath

from test_manifests import _container, _pod

from nvidia_device_plugin.cli.main import build_parser

FEATURES_D = "/etc/kubernetes/node-feature-discovery/features.d"


def test_labels_overlay_writes_into_the_mounted_features_directory() -> None:
    container = _container("overlays/labels")
    env = {e["name"]: e.get("value") for e in container["env"]}
    labels_file = PurePosixPath(env["NVDP_LABELS_FILE"])
    volumes = {v["name"]: v for v in _pod("overlays/labels")["volumes"]}
    [mount] = [m for m in container["volumeMounts"] if PurePosixPath(m["mountPath"]) == labels_file.parent]
    assert not mount.get("readOnly", False)
    assert volumes[mount["name"]]["hostPath"]["path"] == FEATURES_D
    args = build_parser(env).parse_args(["run"])
    assert (args.labels_file, args.machine_type_file) == (str(labels_file), env["NVDP_MACHINE_TYPE_FILE"])


def test_only_the_labels_overlay_mounts_features_d() -> None:
    for kustomization in ("manifests", "overlays/cdi", "overlays/mig"):
        paths = {v.get("hostPath", {}).get("path") for v in _pod(kustomization)["volumes"]}
        assert FEATURES_D not in paths, kustomization

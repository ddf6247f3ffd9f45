"""The DRA mode through the chart (ours, off by default): `dra.enabled` (preset `dra`) or a config in
config.map that turns DRA on gives the plugin container every path `run`'s DRA flags default to, mounted from
the same host path, NODE_NAME and an API token, and exactly the ClusterRole docs/dra.md lists; without either,
none of it."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_checks import field_refs
from helm_engine import HelmFailure, Release
from test_chart import NODE, PLUGIN, _container, _install, _materialize, _of, _pod, _resolved, _values

from nvidia_device_plugin.cli.main import build_parser
from nvidia_device_plugin.config.flags import resolve_config
from nvidia_device_plugin.dra.names import DRIVER_NAME

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount"
DRA_ROLE = "nvidia-device-plugin-dra"
DRA_CONFIG = "version: v1\ndra:\n  enabled: true\n  gpus: [6, 7]\n"


def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container["volumeMounts"]}


def _host_path(release: Release, mount: dict[str, Any]) -> str:
    volumes = {v["name"]: v for v in _pod(release)["volumes"]}
    path: str = volumes[mount["name"]]["hostPath"]["path"]
    return path


def _rules(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def test_the_dra_preset_mounts_every_path_the_dra_mode_uses(tmp_path: Path) -> None:
    release = _install(_values("preset/dra"))
    container = _container(release)
    args, env = _materialize(release, tmp_path)
    parsed = build_parser(env).parse_args(args)
    config = resolve_config(parsed, env)
    assert (config.dra.enabled, config.dra.gpus) == (True, "all")  # NVDP_DRA; the config's gpus (default)
    assert field_refs(container)["NODE_NAME"] == "spec.nodeName"
    assert parsed.node_name == NODE, "dra.enabled without a node name is refused at start"
    mounts = _mounts(container)
    # Read: which devices running pods hold. Written: the registration socket, the endpoint and checkpoint,
    # the per-claim CDI specs. Each at its host path: kubelet dials the endpoint by the path the plugin names.
    read = posixpath.dirname(parsed.pod_resources_socket)
    written = [
        parsed.kubelet_registry_dir,
        posixpath.join(parsed.kubelet_plugins_dir, DRIVER_NAME),
        config.flags.plugin.cdi_spec_dir,
    ]
    for path in [read, *written]:
        assert path in mounts, f"the DRA mode uses {path}, which is not mounted"
        assert _host_path(release, mounts[path]) == path
        assert mounts[path].get("readOnly", False) is (path == read), path
    # The claim specs are made from the driver's files, found where the driver root is mounted.
    driver = mounts[env["CONTAINER_DRIVER_ROOT"]]
    assert driver["readOnly"] is True and _host_path(release, driver) == env["NVIDIA_DRIVER_ROOT"]
    assert TOKEN in mounts and _pod(release)["automountServiceAccountToken"] is False
    assert posixpath.join(parsed.kubelet_plugins_dir, DRIVER_NAME) != parsed.kubelet_plugins_dir
    assert parsed.kubelet_plugins_dir not in mounts, "only the driver's own directory of kubelet's plugins"


def test_the_dra_cluster_role_is_exactly_what_docs_dra_md_lists() -> None:
    release = _install(_values("preset/dra"))
    text = (ROOT / "docs" / "dra.md").read_text()
    section = text[text.index("## RBAC") :]
    [block] = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)[:1]
    documented = _rules(yaml.safe_load(block))
    role = _of(release, "ClusterRole")[DRA_ROLE]
    assert _rules(role["rules"]) == documented
    assert documented == {
        ("resource.k8s.io", "resourceslices", "list"),
        ("resource.k8s.io", "resourceslices", "create"),
        ("resource.k8s.io", "resourceslices", "update"),
        ("resource.k8s.io", "resourceslices", "delete"),
        ("resource.k8s.io", "resourceclaims", "get"),
        ("", "nodes", "get"),
    }
    [binding] = [b for b in _of(release, "ClusterRoleBinding").values() if b["roleRef"]["name"] == DRA_ROLE]
    pod = _pod(release)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "nvidia-device-plugin"}
    ]


def test_dra_gpus_reach_every_node_as_nvdp_dra_gpus(tmp_path: Path) -> None:
    uuid = "GPU-8a3c1f2e-0b4d-4c5e-9f6a-7b8c9d0e1f2a"
    release = _install({**_values("preset/dra"), "dra": {"enabled": True, "gpus": [0, uuid]}})
    assert {e["name"]: e.get("value") for e in _container(release)["env"]}["NVDP_DRA_GPUS"] == f"0,{uuid}"
    assert _resolved(release, tmp_path).dra.gpus == ("0", uuid.lower())


def test_a_config_that_turns_dra_on_brings_the_pieces_without_forcing_dra_on(tmp_path: Path) -> None:
    values = _values("preset/node-labels")
    values["config"] = {**values["config"], "map": {**values["config"]["map"], "dra-6-7": DRA_CONFIG}}
    release = _install(values)
    container = _container(release)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "NVDP_DRA" not in env and "NVDP_DRA_GPUS" not in env, "each node's config decides"
    assert {"/var/lib/kubelet/pod-resources", TOKEN} <= set(_mounts(container))
    assert DRA_ROLE in _of(release, "ClusterRole")
    assert _resolved(release, tmp_path).dra.enabled is False, "the default key keeps DRA off"


@pytest.mark.parametrize(
    "case",
    ["nvidia/values.yaml", "nvidia/example-external-configmap.yaml", "preset/base", "preset/node-labels"],
)
def test_without_dra_the_plugin_gets_none_of_it(case: str) -> None:
    release = _install(_values(case))
    container = _container(release)
    assert DRA_ROLE not in _of(release, "ClusterRole")
    assert not {m for m in _mounts(container) if m.startswith("/var/lib/kubelet/p")}
    assert not any(e["name"].startswith("NVDP_DRA") for e in container["env"])
    assert TOKEN not in _mounts(container)


@pytest.mark.parametrize("selection", ["config-manager", "in-process", "node-name"])
def test_dra_with_every_config_selection_names_each_env_volume_and_mount_once(selection: str) -> None:
    values = _values("preset/node-labels")
    values["config"] = {**values["config"], "selection": selection}
    release = _install({**values, "dra": {"enabled": True, "gpus": None}})
    pod = _pod(release)
    volumes = [v["name"] for v in pod["volumes"]]
    assert len(volumes) == len(set(volumes)), volumes
    for container in pod.get("initContainers", []) + pod["containers"]:
        env = [e["name"] for e in container.get("env", [])]
        mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
        assert len(env) == len(set(env)) and len(mounts) == len(set(mounts)), container["name"]
    plugin = _container(release)
    assert field_refs(plugin)["NODE_NAME"] == "spec.nodeName" and TOKEN in _mounts(plugin)
    assert plugin["name"] == PLUGIN


@pytest.mark.parametrize(
    ("dra", "problem"),
    [
        ({"enabled": "yes"}, r"dra\.enabled must be true or false"),
        ({"enabled": True, "gpus": []}, r"dra\.gpus: \[\] cannot be passed"),
        ({"enabled": True, "gpus": "some"}, r"dra\.gpus must be null"),
    ],
)
def test_dra_values_that_cannot_be_served_are_refused(dra: dict[str, Any], problem: str) -> None:
    with pytest.raises(HelmFailure, match=problem):
        _install({**_values("preset/dra"), "dra": dra})

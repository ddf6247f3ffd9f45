"""gfd.enabled with NVIDIA's default values, both ways NVIDIA's `nfd.enableNodeFeatureApi` can say: GFD
v0.20's NodeFeature API (the default: the env says so explicitly, the downward API gives the pod's node,
namespace and name, the GFD container alone gets a token, and GFD's own account a Role that covers every call
it makes, run here against the stand-in API server) or NFD's features.d file (a hostPath, no token,
no RBAC)."""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chart_checks import allows, field_refs, pod_env, request_verb, schema_problems
from helm_engine import HelmFailure, Release
from test_chart import NODE, PLUGIN, _container, _install, _of, _pod, _values

from nvidia_device_plugin.cli.gfd import build_parser as gfd_build_parser
from nvidia_device_plugin.cli.gfd import main as gfd_main
from nvidia_device_plugin.cli.gfd_settings import GfdSettings, resolve_gfd_settings, with_gfd_env_aliases

from support.fake_apiserver import FakeApiServer, write_kubeconfig

GFD = "nvidia-device-plugin-gpu-feature-discovery"
CTR = "gpu-feature-discovery-ctr"
FEATURES_D = "/etc/kubernetes/node-feature-discovery/features.d"
TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount"
POD_NAME = "nvidia-device-plugin-gpu-feature-discovery-x7k2q"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """gpu-feature-discovery configures logging for the process; later tests get pytest's back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _gfd(nfd: dict[str, Any] | None = None, **gfd: Any) -> Release:
    values = _values("nvidia/values.yaml")
    values["gfd"] = {**values["gfd"], "enabled": True, **gfd}
    if nfd is not None:
        values["nfd"] = {**values["nfd"], **nfd}
    return _install(values)


def _settings(release: Release) -> tuple[GfdSettings, dict[str, str]]:
    container = _container(release, CTR, GFD)
    namespace = _of(release, "DaemonSet")[GFD]["metadata"]["namespace"]
    fields = {"spec.nodeName": NODE, "metadata.namespace": namespace, "metadata.name": POD_NAME}
    env = with_gfd_env_aliases(pod_env(container, fields))
    return resolve_gfd_settings(gfd_build_parser(env).parse_args(container["args"]), env), env


def _host_paths(release: Release) -> set[str]:
    return {v["hostPath"]["path"] for v in _pod(release, GFD)["volumes"] if "hostPath" in v}


@pytest.mark.parametrize("nfd", [None, {"enableNodeFeatureApi": True}], ids=["unset", "true"])
def test_gfd_publishes_the_node_feature_object_by_default(nfd: dict[str, Any] | None) -> None:
    release = _gfd(nfd)
    container = _container(release, CTR, GFD)
    assert {e["name"]: e.get("value") for e in container["env"]}["GFD_USE_NODE_FEATURE_API"] == "true"
    assert field_refs(container) == {
        "NODE_NAME": "spec.nodeName",
        "NAMESPACE": "metadata.namespace",
        "POD_NAME": "metadata.name",
    }
    settings, env = _settings(release)
    assert settings.use_node_feature_api is True
    parsed = gfd_build_parser(env).parse_args(container["args"])
    assert (parsed.node_name, parsed.namespace, parsed.pod_name) == (NODE, "nvidia-device-plugin", POD_NAME)
    # The token: projected into the GFD container alone, nothing mounted from features.d.
    pod = _pod(release, GFD)
    assert pod["automountServiceAccountToken"] is False
    assert TOKEN in {m["mountPath"] for m in container["volumeMounts"]}
    [token] = [v for v in pod["volumes"] if v["name"] == "kube-api-access"]
    assert token["projected"]["sources"][0]["serviceAccountToken"]["path"] == "token"
    assert FEATURES_D not in _host_paths(release)
    assert not any(a.startswith("--output-file") for a in container["args"])
    assert TOKEN not in {m["mountPath"] for m in _container(release)["volumeMounts"]}, "not the plugin's"
    assert not _of(release, "ClusterRole"), "NVIDIA's defaults have no config: no node-label reader"
    assert schema_problems(release.documents()) == []


def test_gfds_role_is_its_own_and_exactly_what_it_calls() -> None:
    release = _gfd()
    pod = _pod(release, GFD)
    [role] = _of(release, "Role").values()
    [binding] = _of(release, "RoleBinding").values()
    namespace = role["metadata"]["namespace"]
    assert role["rules"] == [
        {
            "apiGroups": ["nfd.k8s-sigs.io"],
            "resources": ["nodefeatures"],
            "verbs": ["get", "create", "update"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": namespace}
    ]
    account = _of(release, "ServiceAccount")[pod["serviceAccountName"]]
    assert (account["metadata"]["namespace"], account["automountServiceAccountToken"]) == (namespace, False)
    assert pod["serviceAccountName"] != _pod(release)["serviceAccountName"], (
        "the plugin's rights are not GFD's"
    )


def test_gfd_with_the_charts_env_publishes_within_its_role(tmp_path: Path) -> None:
    """The GFD container's args and env (downward API resolved, the token's API server named by KUBECONFIG)
    run once against the stand-in API server: the object is written, and every request is one the Role
    allows in the pod's namespace."""
    release = _gfd()
    [role] = _of(release, "Role").values()
    namespace = role["metadata"]["namespace"]
    container = _container(release, CTR, GFD)
    machine = tmp_path / "product_name"
    machine.write_text("DGX A100\n")
    args = [a.replace("=/sys/class/dmi/id/product_name", f"={machine}") for a in container["args"]]
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": GFD, "uid": "6a0c7f0e", "controller": True}
    metadata = {"name": POD_NAME, "namespace": namespace, "uid": "0f9e8d7c", "ownerReferences": [owner]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata}
    with FakeApiServer({}) as api:
        api.objects.put(f"/api/v1/namespaces/{namespace}/pods/{POD_NAME}", pod)
        _, env = _settings(release)
        env["KUBECONFIG"] = str(write_kubeconfig(tmp_path / "kubeconfig", api.url))
        assert gfd_main([*args, "--oneshot", "--simulate", "dgx-a100"], env) == 0
        requests = list(api.objects.requests)
        written = api.objects.get(
            f"/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/{namespace}/nodefeatures/nvidia-features-for-{NODE}"
        )
    assert written is not None and written["spec"]["labels"]["nvidia.com/gpu.count"] == "8"
    assert [o["kind"] for o in written["metadata"]["ownerReferences"]] == ["DaemonSet", "Pod"]
    assert requests, "GFD made no request"
    for method, path in requests:
        group, resource, where, verb = request_verb(method, path)
        assert where == namespace and allows(role["rules"], group, resource, verb), (method, path)


def test_gfd_writes_the_features_d_file_with_the_node_feature_api_off() -> None:
    release = _gfd({"enableNodeFeatureApi": False})
    container = _container(release, CTR, GFD)
    assert {e["name"]: e.get("value") for e in container["env"]}["GFD_USE_NODE_FEATURE_API"] == "false"
    settings, _ = _settings(release)
    assert settings.use_node_feature_api is False
    assert settings.output_file.startswith(FEATURES_D + "/")
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in _pod(release, GFD)["volumes"]}
    mount = mounts[posixpath.dirname(settings.output_file)]
    assert not mount.get("readOnly", False) and volumes[mount["name"]]["hostPath"]["path"] == FEATURES_D
    assert TOKEN not in mounts and "kube-api-access" not in volumes
    assert field_refs(container) == {}, "no node, namespace or pod name: no API object"
    assert not _of(release, "Role") and not _of(release, "RoleBinding") and not _of(release, "ClusterRole")
    assert schema_problems(release.documents()) == []


def test_gfd_in_another_namespace_brings_its_account_role_and_label_reader_along() -> None:
    values = _values("nvidia/example-time-slicing.yaml")  # one config: config-manager follows the label
    values["gfd"] = {**values.get("gfd", {}), "enabled": True, "namespaceOverride": "gpu-labels"}
    release = _install(values)
    daemonset = _of(release, "DaemonSet")[GFD]
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    assert daemonset["metadata"]["namespace"] == "gpu-labels"
    assert _of(release, "ServiceAccount")[account]["metadata"]["namespace"] == "gpu-labels"
    [role] = _of(release, "Role").values()
    [binding] = _of(release, "RoleBinding").values()
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "gpu-labels"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "gpu-labels"}]
    [reader] = _of(release, "ClusterRoleBinding").values()
    assert {"kind": "ServiceAccount", "name": account, "namespace": "gpu-labels"} in reader["subjects"]
    init = _container(release, "gpu-feature-discovery-init", GFD)
    assert TOKEN in {m["mountPath"] for m in init["volumeMounts"]}
    assert [v["name"] for v in daemonset["spec"]["template"]["spec"]["volumes"]].count("kube-api-access") == 1
    assert PLUGIN in {c["name"] for c in _pod(release)["containers"]}
    assert schema_problems(release.documents()) == []


def test_a_node_feature_api_value_that_is_no_boolean_is_refused() -> None:
    with pytest.raises(HelmFailure, match=r"nfd\.enableNodeFeatureApi must be true"):
        _install({"gfd": {"enabled": True}, "nfd": {"enableNodeFeatureApi": "yes"}})

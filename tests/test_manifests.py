"""Deployment files checked offline: Kubernetes schemas, and agreement with the CLI, configs and each other.

A manifest that names a flag the CLI does not have, a port the server does not listen on, or a config the
loader rejects would only fail on a real cluster; these tests make it fail here.
"""

from __future__ import annotations

import importlib
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
CONFIGS = ROOT / "configs"
# Schemas of one fixed Kubernetes minor, so the result does not move with the installed package's newest.
KUBERNETES_VERSION = "1.32.0"
NAMESPACE = "nvidia-device-plugin"
# Kinds with no schema in kubernetes-validate (CRDs); their structure is checked by hand below.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def _load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _kubernetes_files() -> list[Path]:
    return sorted(p for p in MANIFESTS.glob("*.yaml") if p.name != "kustomization.yaml")


def _documents() -> list[tuple[str, dict[str, Any]]]:
    return [(path.name, doc) for path in _kubernetes_files() for doc in _load(path)]


def _one(kind: str) -> dict[str, Any]:
    found = [doc for _, doc in _documents() if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} in manifests/, found {len(found)}"
    return found[0]


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in _documents() if doc["kind"] == kind}


def _container() -> dict[str, Any]:
    containers = _one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _require(module: str, name: str) -> Any:
    """`module.name`, or a loud failure (not a skip) while another part of the project is unfinished."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{module}.{name} is needed to check the manifests but cannot be imported yet: {exc!r}")


def _run_args() -> Any:
    build_parser = _require("nvidia_device_plugin.cli", "build_parser")
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


# ---- schemas and layout ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", _kubernetes_files(), ids=lambda p: p.name)
def test_manifest_validates_against_kubernetes_schema(path: Path) -> None:
    docs = _load(path)
    assert docs, f"{path.name} holds no document"
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
            pytest.fail(f"{path.name}: {doc['kind']}/{doc['metadata']['name']} {problem}")


def test_kustomization_lists_every_manifest_and_one_namespace() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == sorted(p.name for p in _kubernetes_files())
    assert kustomization["namespace"] == NAMESPACE
    image = _container()["image"].partition(":")[0]
    assert [i["name"] for i in kustomization["images"]] == [image]
    for name, doc in _documents():
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == NAMESPACE, f"{name}: {doc['kind']} not in {NAMESPACE}"
    assert _one("Namespace")["metadata"]["name"] == NAMESPACE


def test_kustomization_builds_with_kubectl() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; the kustomization's structure is checked above without it")
    built = subprocess.run(
        [kubectl, "kustomize", str(MANIFESTS)], capture_output=True, text=True, timeout=60, check=False
    )
    assert built.returncode == 0, built.stderr
    docs = [doc for doc in yaml.safe_load_all(built.stdout) if doc]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == sorted(
        (d["kind"], d["metadata"]["name"]) for _, d in _documents()
    )
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "nvidia-device-plugin"


def test_no_rbac_objects_and_no_service_account_token() -> None:
    kinds = {doc["kind"] for _, doc in _documents()}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] in _by_kind("ServiceAccount")
    assert pod["automountServiceAccountToken"] is False


# ---- the DaemonSet against the CLI ---------------------------------------------------------------------


def test_daemonset_args_are_valid_cli_flags() -> None:
    args = _run_args()
    assert args.command == "run"
    assert args.config_dir == "/config"
    assert args.config_default
    assert args.metrics_address


def test_device_plugin_hostpath_is_the_cli_default_and_mounted_there() -> None:
    default_dir = _require("nvidia_device_plugin.cli", "DEFAULT_PLUGIN_DIR")
    assert _run_args().device_plugin_path == default_dir
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in _container()["volumeMounts"]}
    assert default_dir in mounts, f"nothing is mounted at {default_dir}"
    host_path = volumes[mounts[default_dir]]["hostPath"]
    assert host_path == {"path": default_dir, "type": "Directory"}


def test_metrics_port_probes_service_and_monitor_agree() -> None:
    port = _metrics_port()
    container = _container()
    assert [p["containerPort"] for p in container["ports"]] == [port]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert _named_port(container[probe]["httpGet"]["port"]) == port
    service = _one("Service")
    [service_port] = service["spec"]["ports"]
    assert service_port["port"] == port
    assert _named_port(service_port["targetPort"]) == port
    assert service["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    template_labels = _one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= template_labels.items()


def test_security_context_is_minimal() -> None:
    context = _container()["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context.get("privileged", False) is False
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 0  # why: docs/operations.md, "Security context"
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")


def test_daemonset_scheduling_and_updates() -> None:
    daemonset = _one("DaemonSet")
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
    assert keys == {"feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present"}
    resources = _container()["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"] and resources["limits"]["memory"]


# ---- configs -------------------------------------------------------------------------------------


def _config_maps() -> dict[str, dict[str, Any]]:
    return _by_kind("ConfigMap")


def test_configmap_data_parses_with_the_config_loader() -> None:
    parse_config_text = _require("nvidia_device_plugin.config.loader", "parse_config_text")
    config_maps = _config_maps()
    assert {"nvidia-device-plugin-time-slicing", "nvidia-device-plugin-mig-mixed"} <= set(config_maps)
    for name, config_map in config_maps.items():
        for key, text in config_map["data"].items():
            config = parse_config_text(text, f"{name}/{key}")
            assert config.version == "v1"
    time_slicing = parse_config_text(config_maps["nvidia-device-plugin-time-slicing"]["data"]["time-slicing"])
    assert time_slicing.sharing.strategy == "time-slicing"
    mig_mixed = parse_config_text(config_maps["nvidia-device-plugin-mig-mixed"]["data"]["mig-mixed"])
    assert mig_mixed.flags.mig_strategy == "mixed"


@pytest.mark.parametrize(
    ("config_map", "key", "config_file"),
    [
        ("nvidia-device-plugin-time-slicing", "time-slicing", "time-slicing.yaml"),
        ("nvidia-device-plugin-mig-mixed", "mig-mixed", "mig-mixed.yaml"),
    ],
)
def test_configmaps_carry_the_documents_in_configs(config_map: str, key: str, config_file: str) -> None:
    source = CONFIGS / config_file
    assert source.is_file(), f"configs/{config_file} is missing; the ConfigMap is meant to be a copy of it"
    assert _config_maps()[config_map]["data"][key].strip() == source.read_text().strip(), (
        f"manifests' {config_map} and configs/{config_file} differ; copy one over the other"
    )


def test_config_volume_holds_the_default_config() -> None:
    args = _run_args()
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in _container()["volumeMounts"]}
    sources = volumes[mounts[args.config_dir]]["projected"]["sources"]
    keys: set[str] = set()
    for source in sources:
        name = source["configMap"]["name"]
        assert name in _config_maps(), f"the config volume projects ConfigMap {name}, which manifests/ lacks"
        keys |= set(_config_maps()[name]["data"])
    assert args.config_default in keys


# ---- the ServiceMonitor (a CRD: no schema, so its structure) -----------------------------------------


def test_servicemonitor_selects_the_metrics_service_port() -> None:
    monitor = _one("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) <= {"selector", "namespaceSelector", "endpoints", "jobLabel"}
    service = _one("Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert re.fullmatch(r"\d+s", endpoint["interval"]) and re.fullmatch(r"\d+s", endpoint["scrapeTimeout"])


# ---- the image -------------------------------------------------------------------------------------------


def _dockerfile() -> list[str]:
    """Instructions of the Dockerfile, continuation lines joined and comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return [i.strip() for i in re.sub(r"\\\n", " ", "\n".join(lines)).splitlines() if i.strip()]


def test_dockerfile_is_multi_stage_on_pinned_bases() -> None:
    instructions = _dockerfile()
    args = dict(m.groups() for i in instructions if (m := re.fullmatch(r"ARG\s+(\w+)=(\S+)", i)))
    froms = [i.split()[1:] for i in instructions if i.startswith("FROM ")]
    assert len(froms) >= 2, "expected a builder stage and a runtime stage"
    assert [f[-1] for f in froms] == ["builder", "runtime"]
    for image, *_ in froms:
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        name, _, tag = resolved.partition(":")
        assert name == "python", resolved
        assert re.fullmatch(r"3\.11\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", tag), (
            f"unpinned base {resolved}"
        )
    runtime = instructions[instructions.index(next(i for i in instructions if i.endswith("AS runtime"))) :]
    assert any("from=builder" in i or "--from=builder" in i for i in runtime), "runtime must take the wheels"
    assert not any(i.startswith(("COPY nvidia_device_plugin", "COPY .")) for i in runtime)


def test_dockerfile_entrypoint_cmd_and_labels() -> None:
    instructions = _dockerfile()
    assert 'ENTRYPOINT ["nvidia-device-plugin"]' in instructions
    assert 'CMD ["run"]' in instructions
    labels = " ".join(i for i in instructions if i.startswith("LABEL "))
    for key in ("title", "description", "version", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels


def test_dockerignore_keeps_local_state_out() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv"} <= ignored
    for needed in ("pyproject.toml", "setup.cfg", "README.md", "nvidia_device_plugin"):
        assert needed not in ignored


def test_makefile_builds_the_image_the_manifests_use() -> None:
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^image:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert target, "the Makefile has no image target"
    assert "docker build" in target.group(1)
    image = _container()["image"].partition(":")[0]
    assert f"-t {image}:" in target.group(1)

"""The Helm chart (deployments/helm/nvidia-device-plugin), installed by the real Helm engine (helm_engine.py):
every values preset and NVIDIA's own values files (data/nvidia-chart/) give objects that validate against the
Kubernetes 1.34-1.37 schemas, NVIDIA's files mean here what they mean in NVIDIA's chart with only `image`
changed, the chart's refusals name the value, one value sets every container's image, and manifests/ is the
chart's rendering.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helm_engine import LINT_WARNING, HelmFailure, Release, install, lint
from render_manifests import CHART, MANIFESTS, differences, preset_names, preset_values

from nvidia_device_plugin import __version__
from nvidia_device_plugin.cli.gfd import build_parser as gfd_build_parser
from nvidia_device_plugin.cli.gfd_settings import resolve_gfd_settings, with_gfd_env_aliases
from nvidia_device_plugin.cli.main import build_parser
from nvidia_device_plugin.config.flags import resolve_config
from nvidia_device_plugin.config.selection import parse_fallback_strategies, select_config
from nvidia_device_plugin.config.v1 import Config

from support.waiting import scaled

ROOT = Path(__file__).resolve().parents[2]
NVIDIA_VALUES = Path(__file__).parent / "data" / "nvidia-chart"
KUBERNETES_VERSIONS = ["1.34.0", "1.35.0", "1.36.0", "1.37.0"]
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
OUR_IMAGE = {"repository": "registry.example.com/gpu/nvidia-device-plugin-py"}
NODE = "gpu-node-1"
PLUGIN = "nvidia-device-plugin-ctr"
NVIDIA_FILES = sorted(p.name for p in NVIDIA_VALUES.glob("*.yaml"))
CASES = [f"preset/{name}" for name in preset_names()] + [f"nvidia/{name}" for name in NVIDIA_FILES]


def _values(case: str) -> dict[str, Any]:
    kind, _, name = case.partition("/")
    if kind == "preset":
        return preset_values(name)
    values: dict[str, Any] = yaml.safe_load((NVIDIA_VALUES / name).read_text()) or {}
    return {**values, "image": {**values.get("image", {}), **OUR_IMAGE}}  # the one change a user makes


@functools.cache
def _cached(values_json: str, namespace: str) -> Release:
    return install(CHART, json.loads(values_json), namespace=namespace)


def _install(values: dict[str, Any], namespace: str = "nvidia-device-plugin") -> Release:
    if sys.version_info < (3, 12):
        pytest.fail(
            "helm-sdkpy (the Helm engine) needs Python >= 3.12: build .venv with python3.12 (make test)"
        )
    return _cached(json.dumps(values, sort_keys=True), namespace)


def _of(release: Release, kind: str) -> dict[str, dict[str, Any]]:
    """This chart's own objects of `kind` by name: not its Node Feature Discovery subchart's (alias nfd)."""
    return {
        d["metadata"]["name"]: d
        for d in release.documents()
        if d["kind"] == kind and not _from_nfd_subchart(d)
    }


def _from_nfd_subchart(doc: dict[str, Any]) -> bool:
    return str(doc["metadata"].get("labels", {}).get("helm.sh/chart", "")).startswith("nfd-")


def _pod(release: Release, daemonset: str = "nvidia-device-plugin") -> dict[str, Any]:
    pod: dict[str, Any] = _of(release, "DaemonSet")[daemonset]["spec"]["template"]["spec"]
    return pod


def _container(
    release: Release, name: str = PLUGIN, daemonset: str = "nvidia-device-plugin"
) -> dict[str, Any]:
    pod = _pod(release, daemonset)
    [found] = [c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == name]
    return found


def _env(container: dict[str, Any]) -> dict[str, str]:
    env = {}
    for entry in container.get("env", []):
        env[entry["name"]] = entry.get("value", NODE)  # NODE: a fieldRef spec.nodeName
    return env


def test_helm_lint_finds_no_warning_or_error() -> None:
    if sys.version_info < (3, 12):
        pytest.fail(
            "helm-sdkpy (the Helm engine) needs Python >= 3.12: build .venv with python3.12 (make test)"
        )
    messages = lint(CHART)
    assert messages, "lint reports at least its info lines; none means it did not run"
    assert [m for m in messages if m["Severity"] >= LINT_WARNING] == []


# ---- every install: what Helm created, and each object against the Kubernetes schemas ----------------------


@pytest.mark.parametrize("case", CASES)
def test_helm_creates_exactly_what_it_rendered(case: str) -> None:
    release = _install(_values(case))
    rendered = sorted((d["kind"], d["metadata"]["name"]) for d in release.documents())
    # Helm creates a subchart's crds/ (Node Feature Discovery's, with gfd or nfd enabled) before the release's
    # objects, and keeps them out of the release manifest.
    crds = [d for d in release.created if d["kind"] == "CustomResourceDefinition"]
    assert {d["spec"]["group"] for d in crds} <= {"nfd.k8s-sigs.io"}  # none without gfd or nfd
    created = sorted((d["kind"], d["metadata"]["name"]) for d in release.created if d not in crds)
    assert rendered and created == rendered
    assert ("DaemonSet", "nvidia-device-plugin") in rendered


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("case", CASES)
def test_every_object_validates_against_the_kubernetes_schema(case: str, version: str) -> None:
    for doc in _install(_values(case)).documents():
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            continue  # a CRD: no schema here; test_manifests checks the ServiceMonitor's structure
        problem = None
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problem = f"at {'.'.join(str(p) for p in exc.path) or 'the top'}: {exc.message}"
        if problem:  # outside the except block: one line, not the schema dump
            pytest.fail(f"{case} at Kubernetes {version}: {doc['kind']}/{doc['metadata']['name']} {problem}")


def _materialize(release: Release, root: Path) -> tuple[list[str], dict[str, str]]:
    """The plugin container's args and env as the pod sees them, its config volumes written under `root`."""
    container = _container(release)
    args, env = list(container["args"]), _env(container)
    config_maps = _of(release, "ConfigMap")
    if config_maps:
        [data] = [c["data"] for c in config_maps.values()]
        available = root / "available-configs"
        available.mkdir()
        for key, text in data.items():
            (available / key).write_text(text)
        if any(c["name"] == "nvidia-device-plugin-init" for c in _pod(release).get("initContainers", [])):
            init = _env(_container(release, "nvidia-device-plugin-init"))
            chosen = select_config(
                "", data, init["DEFAULT_CONFIG"], parse_fallback_strategies(init["FALLBACK_STRATEGIES"])
            )
            (root / "config").mkdir()
            (root / "config" / "config.yaml").symlink_to(available / str(chosen.name))
    moved = [a.replace("=/available-configs", f"={root}/available-configs") for a in args]
    moved = [a.replace("=/config/", f"={root}/config/") for a in moved]
    return moved, env


def _resolved(release: Release, root: Path) -> Config:
    args, env = _materialize(release, root)
    assert args[0] == "run", "the container's args replace the image's CMD, so they start with the command"
    try:
        parsed = build_parser(env).parse_args(args)
    except SystemExit:
        pytest.fail(f"the plugin container's args are not the CLI's: {args}")
    config: Config = resolve_config(parsed, env)
    return config


@pytest.mark.parametrize("case", [c for c in CASES if c != "nvidia/example-external-configmap.yaml"])
def test_the_plugin_reads_the_config_the_install_gives_it(case: str, tmp_path: Path) -> None:
    config = _resolved(_install(_values(case)), tmp_path)
    assert config.version == "v1"


# ---- NVIDIA's values files mean what they mean in NVIDIA's chart -------------------------------------------


def test_nvidias_defaults_install_the_plugin_alone_with_its_defaults(tmp_path: Path) -> None:
    release = _install(_values("nvidia/values.yaml"))
    # The MPS control daemon is rendered as NVIDIA's is, for nodes labelled nvidia.com/mps.capable=true.
    assert set(_of(release, "DaemonSet")) == {
        "nvidia-device-plugin",
        "nvidia-device-plugin-mps-control-daemon",
    }
    assert _pod(release, "nvidia-device-plugin-mps-control-daemon")["nodeSelector"] == {
        "nvidia.com/mps.capable": "true"
    }
    assert not _of(release, "ConfigMap") and not _of(release, "ClusterRole")
    assert not _of(release, "NetworkPolicy"), "opt-in (issue 31): it would refuse every Prometheus but one"
    container = _container(release)
    assert _env(container) == {
        "MPS_ROOT": "/run/nvidia/mps",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    }
    assert container["image"] == f"{OUR_IMAGE['repository']}:{__version__}"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    pod = _pod(release)
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert [t["matchExpressions"][0]["key"] for t in terms] == [
        "feature.node.kubernetes.io/pci-10de.present",
        "feature.node.kubernetes.io/cpu-model.vendor_id",
        "nvidia.com/gpu.present",
    ]
    assert pod["priorityClassName"] == "system-node-critical"
    config = _resolved(release, tmp_path)
    assert config.flags.mig_strategy == "none" and config.sharing.strategy not in {"time-slicing", "mps"}


def test_a_single_config_in_the_map_is_followed_by_config_manager(tmp_path: Path) -> None:
    release = _install(_values("nvidia/example-time-slicing.yaml"))
    pod = _pod(release)
    assert [c["name"] for c in pod["initContainers"]] == ["nvidia-device-plugin-init"]
    assert [c["name"] for c in pod["containers"]] == [PLUGIN, "nvidia-device-plugin-sidecar"]
    for name in ("nvidia-device-plugin-init", "nvidia-device-plugin-sidecar"):
        env = _env(_container(release, name))
        assert (env["NODE_LABEL"], env["FALLBACK_STRATEGIES"]) == (
            "nvidia.com/device-plugin.config",
            "named,single",
        )
        assert (env["CONFIG_FILE_SRCDIR"], env["CONFIG_FILE_DST"]) == (
            "/available-configs",
            "/config/config.yaml",
        )
    [role] = _of(release, "ClusterRole").values()
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]
    config = _resolved(release, tmp_path)
    assert config.sharing.strategy == "time-slicing"
    assert not _container(release)["securityContext"]["capabilities"].get("add"), "no MIG in the only config"


def test_a_mig_config_in_the_map_brings_the_mig_env_and_sys_admin() -> None:
    release = _install(_values("nvidia/example-multiple-configs.yaml"))
    container = _container(release)
    assert _env(container)["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert _env(_container(release, "nvidia-device-plugin-init"))["DEFAULT_CONFIG"] == "config0"


def test_an_external_configmap_is_mounted_and_assumed_to_need_everything() -> None:
    release = _install(_values("nvidia/example-external-configmap.yaml"))
    assert not _of(release, "ConfigMap")
    volumes = {v["name"]: v for v in _pod(release)["volumes"]}
    assert volumes["available-configs"]["configMap"]["name"] == "nvidia-plugin-configs"
    mounts = {m["mountPath"] for m in _container(release)["volumeMounts"]}
    assert {"/run/nvidia/mps", "/dev/shm", "/var/run/cdi", "/driver-root"} <= mounts
    assert "nvidia-device-plugin-mps-control-daemon" in _of(release, "DaemonSet")
    assert _container(release)["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]


def test_an_mps_config_brings_the_mps_control_daemon() -> None:
    release = _install(_values("nvidia/example-mps.yaml"))
    control = _pod(release, "nvidia-device-plugin-mps-control-daemon")
    assert control["hostPID"] is True
    main = _container(release, "mps-control-daemon-ctr", "nvidia-device-plugin-mps-control-daemon")
    assert main["args"][:2] == ["mps-control-daemon", "--config-file=/config/config.yaml"]
    plugin_mounts = {m["mountPath"] for m in _container(release)["volumeMounts"]}
    assert {"/run/nvidia/mps", "/dev/shm"} <= plugin_mounts


def test_in_process_selection_gives_the_plugin_the_label_and_the_token(tmp_path: Path) -> None:
    values = {
        **_values("preset/node-labels"),
        "config": {**_values("preset/node-labels")["config"], "selection": "in-process"},
    }
    release = _install(values)
    pod = _pod(release)
    assert [c["name"] for c in pod["containers"]] == [PLUGIN] and "initContainers" not in pod
    container = _container(release)
    assert "--node-config-label=nvidia.com/device-plugin.config" in container["args"]
    assert _env(container)["NODE_NAME"] == NODE
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in {
        m["mountPath"] for m in container["volumeMounts"]
    }
    parsed = build_parser(_env(container)).parse_args(_materialize(release, tmp_path)[0])
    assert (parsed.node_config_label, parsed.config_default) == ("nvidia.com/device-plugin.config", "default")
    # The MPS control daemon has no label follower of its own: it keeps config-manager containers.
    control = _pod(release, "nvidia-device-plugin-mps-control-daemon")
    assert [c["name"] for c in control["initContainers"]] == ["mps-control-daemon-init"]
    assert list(_of(release, "ClusterRole")) == ["nvidia-device-plugin-node-label-reader"]


def test_nvidias_flags_become_their_environment_variables(tmp_path: Path) -> None:
    release = _install(_values("nvidia/example-flags.yaml"))
    env = _env(_container(release))
    assert {k: env[k] for k in ("MIG_STRATEGY", "PASS_DEVICE_SPECS", "FAIL_ON_INIT_ERROR")} == {
        "MIG_STRATEGY": "mixed",
        "PASS_DEVICE_SPECS": "true",
        "FAIL_ON_INIT_ERROR": "false",
    }
    assert (env["DEVICE_LIST_STRATEGY"], env["DEVICE_ID_STRATEGY"]) == ("volume-mounts", "index")
    assert _container(release)["securityContext"] == {"privileged": True}  # compatWithCPUManager, as NVIDIA's
    config = _resolved(release, tmp_path)
    assert config.flags.mig_strategy == "mixed"
    assert config.flags.plugin.pass_device_specs is True and config.flags.fail_on_init_error is False
    assert "nvidia-device-plugin-gpu-feature-discovery" in _of(release, "DaemonSet")
    # gfd.enabled installs Node Feature Discovery, as NVIDIA's chart (its subchart, alias nfd).
    nfd = {(d["kind"], d["metadata"]["name"]) for d in release.documents() if _from_nfd_subchart(d)}
    assert ("DaemonSet", "nvidia-device-plugin-node-feature-discovery-worker") in nfd


def test_gfd_runs_this_images_gpu_feature_discovery() -> None:
    values = {
        **_values("nvidia/values.yaml"),
        "gfd": {"enabled": True, "noTimestamp": True, "sleepInterval": "30s"},
    }
    release = _install(values)
    name = "nvidia-device-plugin-gpu-feature-discovery"
    gfd = _container(release, "gpu-feature-discovery-ctr", name)
    assert gfd["command"] == ["gpu-feature-discovery"]
    assert {k: v for k, v in _env(gfd).items() if k.startswith("GFD_")} == {
        "GFD_NO_TIMESTAMP": "true",
        "GFD_SLEEP_INTERVAL": "30s",
        "GFD_USE_NODE_FEATURE_API": "true",  # GFD v0.20's default output; test_chart_gfd.py has both ways
    }
    env = with_gfd_env_aliases(_env(gfd))
    settings = resolve_gfd_settings(gfd_build_parser(env).parse_args(gfd["args"]), env)
    assert (settings.no_timestamp, settings.sleep_interval, settings.use_node_feature_api) == (
        True,
        30.0,
        True,
    )
    selector = _of(release, "DaemonSet")[name]["spec"]["selector"]["matchLabels"]
    plugin_pods = _of(release, "DaemonSet")["nvidia-device-plugin"]["spec"]["template"]["metadata"]["labels"]
    # NVIDIA's default: one selector for every DaemonSet (an upgrade keeps it; selectors cannot change),
    # the pods told apart by their component label; componentSelectorLabels.enabled separates them
    # (test_upgrade_from_nvidia.py).
    assert selector.items() <= plugin_pods.items()
    assert plugin_pods["app.kubernetes.io/component"] == "device-plugin"


def test_cdi_values_mount_the_spec_directory_and_the_driver_root() -> None:
    release = _install(_values("nvidia/example-cdi.yaml"))
    container = _container(release)
    env = _env(container)
    assert env["DEVICE_LIST_STRATEGY"] == "cdi-cri"
    assert (env["NVIDIA_DRIVER_ROOT"], env["CONTAINER_DRIVER_ROOT"]) == ("/run/nvidia/driver", "/driver-root")
    assert (env["NVIDIA_CDI_HOOK_PATH"], env["CDI_FEATURE_FLAGS"]) == (
        "/usr/bin/nvidia-cdi-hook",
        "disable-multiple-csv-devices",
    )
    volumes = {v["name"]: v for v in _pod(release)["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert not mounts["/var/run/cdi"].get("readOnly", False)
    assert volumes[mounts["/driver-root"]["name"]]["hostPath"]["path"] == "/run/nvidia/driver"
    assert _pod(release)["runtimeClassName"] == "nvidia"


def test_the_gpu_operators_hook_path_reaches_the_plugins_cdi_settings(tmp_path: Path) -> None:
    """GPU Operator nodes have the hook at /usr/local/nvidia/toolkit/nvidia-ctk (docs/operations.md)."""
    hook = "/usr/local/nvidia/toolkit/nvidia-ctk"
    values = _values("nvidia/example-cdi.yaml")
    release = _install({**values, "cdi": {**values["cdi"], "nvidiaHookPath": hook}})
    assert _env(_container(release))["NVIDIA_CDI_HOOK_PATH"] == hook
    assert _resolved(release, tmp_path).flags.plugin.nvidia_ctk_path == hook
    assert hook in (ROOT / "docs" / "operations.md").read_text()


def test_name_overrides_and_pod_settings_are_nvidias() -> None:
    values = {
        **_values("nvidia/values.yaml"),
        "fullnameOverride": "gpu-plugin",
        "selectorLabelsOverride": {"app": "gpu-plugin"},
        "podAnnotations": {"example.com/owner": "platform"},
        "podSecurityContext": {"runAsUser": 0, "fsGroup": 0},
        "devicePlugin": {"enableHostNetwork": True},
        "priorityClassName": "",
        "updateStrategy": {"type": "OnDelete"},
        "nodeSelector": {"gpu": "yes"},
    }
    release = _install(values)
    daemonset = _of(release, "DaemonSet")["gpu-plugin"]
    assert daemonset["spec"]["selector"]["matchLabels"] == {"app": "gpu-plugin"}
    assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}
    template = daemonset["spec"]["template"]
    assert template["metadata"]["annotations"] == {"example.com/owner": "platform"}
    pod = template["spec"]
    assert pod["securityContext"] == {"runAsUser": 0, "fsGroup": 0}
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert "priorityClassName" not in pod and pod["nodeSelector"] == {"gpu": "yes"}
    assert (
        _of(release, "Service")["gpu-plugin-metrics"]["spec"]["selector"].items()
        <= template["metadata"]["labels"].items()
    )


# ---- refusals, as NVIDIA's chart refuses (and ours) --------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "namespace", "problem"),
    [
        ({"namespace": "gpu"}, "nvidia-device-plugin", "'namespace'"),
        ({}, "default", "namespace is 'default'"),
        (
            {"config": {"name": "x", "map": {"a": "version: v1"}}},
            "nvidia-device-plugin",
            "only one of config.name",
        ),
        (
            {"config": {"map": {"a": "version: v1", "b": "version: v1"}, "fallbackStrategies": ["single"]}},
            "nvidia-device-plugin",
            "config.map has 2 configs",
        ),
        ({"config": {"selection": "labels"}}, "nvidia-device-plugin", "config.selection must be"),
        ({"labels": {"enabled": True}, "gfd": {"enabled": True}}, "nvidia-device-plugin", "both write"),
    ],
)
def test_the_chart_refuses_with_a_message_naming_the_value(
    values: dict[str, Any], namespace: str, problem: str
) -> None:
    with pytest.raises(HelmFailure, match=problem):
        _install(values, namespace=namespace)


def test_the_default_namespace_is_allowed_when_asked() -> None:
    release = _install({"allowDefaultNamespace": True}, namespace="default")
    assert _of(release, "DaemonSet")["nvidia-device-plugin"]["metadata"]["namespace"] == "default"


# ---- one image for every container -------------------------------------------------------------------------


def _images(release: Release) -> set[str]:
    images = set()
    for daemonset in _of(release, "DaemonSet").values():
        pod = daemonset["spec"]["template"]["spec"]
        images |= {c["image"] for c in pod.get("initContainers", []) + pod["containers"]}
    return images


@pytest.mark.parametrize("preset", preset_names())
def test_one_image_value_sets_every_container_of_every_preset(preset: str) -> None:
    assert _images(_install(preset_values(preset))) == {f"{OUR_IMAGE['repository']}:{__version__}"}
    moved = {**preset_values(preset), "image": {"repository": "gpu.corp.example/ml/nvdp", "tag": "9.9.9"}}
    assert _images(_install(moved)) == {"gpu.corp.example/ml/nvdp:9.9.9"}
    digest = "sha256:" + "ab" * 32
    pinned = {**preset_values(preset), "image": {"repository": "gpu.corp.example/ml/nvdp", "tag": digest}}
    assert _images(_install(pinned)) == {f"gpu.corp.example/ml/nvdp@{digest}"}


def test_the_default_image_is_fully_qualified_with_a_placeholder_registry() -> None:
    repository = yaml.safe_load((CHART / "values.yaml").read_text())["image"]["repository"]
    registry = repository.split("/")[0]
    assert "." in registry, f"{repository} is not fully qualified (a short name CRI-O refuses)"
    assert registry == "registry.example.com", "the docs tell users to replace this placeholder"
    assert "placeholder" in _install(preset_values("base")).notes


def test_one_kustomize_entry_sets_every_container_of_the_static_manifests(tmp_path: Path) -> None:
    copy = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, copy)
    component = copy / "image" / "kustomization.yaml"
    document = yaml.safe_load(component.read_text())
    [entry] = document["images"]
    assert (entry["name"], entry["newTag"]) == (OUR_IMAGE["repository"], __version__)
    entry.update(newName="gpu.corp.example/nvdp", newTag="9.9.9")
    component.write_text(yaml.safe_dump(document))
    kubectl = Path(sys.executable).parent / "kubectl"
    for directory in [copy, *sorted((copy / "overlays").iterdir())]:
        built = subprocess.run(
            [str(kubectl), "kustomize", str(directory)],
            capture_output=True,
            text=True,
            timeout=scaled(120),
            check=False,
        )
        assert built.returncode == 0, built.stderr
        images = set()
        for doc in yaml.safe_load_all(built.stdout):
            if doc and doc["kind"] == "DaemonSet":
                pod = doc["spec"]["template"]["spec"]
                images |= {c["image"] for c in pod.get("initContainers", []) + pod["containers"]}
        assert images == {"gpu.corp.example/nvdp:9.9.9"}, directory.name


# ---- the static manifests are the chart's rendering --------------------------------------------------------


def test_the_static_manifests_are_what_the_chart_renders() -> None:
    if sys.version_info < (3, 12):
        pytest.fail(
            "helm-sdkpy (the Helm engine) needs Python >= 3.12: build .venv with python3.12 (make test)"
        )
    assert differences() == [], "manifests/ and the chart disagree: run `make manifests`"
    rendered = {p.parent.name for p in MANIFESTS.glob("**/nvidia-device-plugin.yaml")}
    assert rendered == {"base", *(n for n in preset_names() if n != "base")}

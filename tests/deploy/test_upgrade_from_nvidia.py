"""`helm upgrade` from NVIDIA's nvidia-device-plugin release v0.20 to this chart, and `helm rollback`, with
the same values: Helm's three-way merge patches every object both releases render and deletes what only the
old one has, and the API server refuses a patch of a DaemonSet's or Deployment's spec.selector (immutable). So
for the values sets NVIDIA's README documents, every workload, ConfigMap and Node Feature Discovery object
NVIDIA's release renders must be rendered by ours with the same kind, name, namespace and selector, either
way.

NVIDIA's side: its templates are not kept here (other people's code); what they render is written down as
facts (`_nvidia_objects`, from NVIDIA's v0.20 templates/daemonset-*.yml and configmap.yml), and its Node
Feature Discovery objects are rendered for real from the archive both charts depend on
(charts/node-feature-discovery-0.19.0.tgz) with NVIDIA's nfd values (data/nvidia-chart/values.yaml). Our side
is `helm install` of this chart by the real Helm engine (helm_engine.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml
from helm_engine import HelmFailure, Release, install
from render_manifests import CHART

NVIDIA = Path(__file__).parent / "data" / "nvidia-chart"
NFD_ARCHIVE = CHART / "charts" / "node-feature-discovery-0.19.0.tgz"
NFD_SHA256 = "448bf928930072e80e5daec32450bd21cb348c0069fea4fd15b835a7114bc297"
RELEASE = "nvdp"  # NVIDIA's README: helm upgrade -i nvdp nvdp/nvidia-device-plugin -n nvidia-device-plugin
NAMESPACE = "nvidia-device-plugin"
FULLNAME = "nvdp-nvidia-device-plugin"
WORKLOADS = {"DaemonSet", "Deployment"}
# The oldest and newest Kubernetes whose schemas kubernetes-validate has (the chart claims >= 1.10; older
# schemas are not published in a form it reads).
SCHEMA_VERSIONS = [min(kubernetes_validate.utils.all_versions()), kubernetes_validate.utils.latest_version()]
CUSTOM_KINDS = {"ServiceMonitor"}


def _example(name: str) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((NVIDIA / name).read_text())
    return values


# The values sets NVIDIA's README documents, as `helm upgrade` would be given them.
CASES: dict[str, dict[str, Any]] = {
    "default": {},
    "gfd.enabled": {"gfd": {"enabled": True}},
    "nfd.enabled": {"nfd": {"enabled": True}},
    "nfd.master-worker": {
        "nfd": {
            "enabled": True,
            "master": {"replicaCount": 2},
            "worker": {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        }
    },
    "config.map": _example("example-time-slicing.yaml"),
    "config.name": _example("example-external-configmap.yaml"),
    "config.default": _example("example-multiple-configs.yaml"),
    "mps": _example("example-mps.yaml"),
    "migStrategy=single": {"migStrategy": "single"},
    "migStrategy=mixed": {"migStrategy": "mixed"},
    "devicePlugin.enabled=false": {"devicePlugin": {"enabled": False}},
    "devicePlugin.enabled=false,gfd.enabled": {"devicePlugin": {"enabled": False}, "gfd": {"enabled": True}},
    "componentSelectorLabels.enabled": {
        "componentSelectorLabels": {"enabled": True},
        "gfd": {"enabled": True},
    },
}


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of a values file over defaults: maps merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


@functools.cache
def _install(chart: str, values_json: str, kube_version: str = "1.37") -> Release:
    if sys.version_info < (3, 12):
        pytest.fail("helm-sdkpy (the Helm engine) needs Python >= 3.12: build .venv with python3.12")
    return install(
        Path(chart), json.loads(values_json), release=RELEASE, namespace=NAMESPACE, kube_version=kube_version
    )


def _ours(values: dict[str, Any]) -> Release:
    return _install(str(CHART), json.dumps(values, sort_keys=True))


def _nvidia_nfd(values: dict[str, Any]) -> list[dict[str, Any]]:
    """What NVIDIA's chart renders of its nfd subchart: condition nfd.enabled,gfd.enabled (the first one set
    wins), values = NVIDIA's nfd defaults with the user's nfd.* over them."""
    nfd = values.get("nfd", {})
    enabled = nfd["enabled"] if "enabled" in nfd else values.get("gfd", {}).get("enabled", False)
    if not enabled:
        return []
    defaults = yaml.safe_load((NVIDIA / "values.yaml").read_text())["nfd"]
    subchart_values = _merged(defaults, {k: v for k, v in nfd.items() if k != "enabled"})
    return _install(str(NFD_ARCHIVE), json.dumps(subchart_values, sort_keys=True)).documents()


def _nvidia_objects(values: dict[str, Any]) -> list[dict[str, Any]]:
    """NVIDIA's v0.20 workloads and ConfigMap (kind, name, namespace, selector), and its NFD objects."""
    selector = {"app.kubernetes.io/name": "nvidia-device-plugin", "app.kubernetes.io/instance": RELEASE}
    plugin = values.get("devicePlugin", {}).get("enabled", True)
    components = []
    if plugin:  # daemonset-device-plugin.yml and daemonset-mps-control-daemon.yml: if devicePlugin.enabled
        components += ["device-plugin", "mps-control-daemon"]
    if values.get("gfd", {}).get("enabled", False):  # daemonset-gfd.yml: all three share one selector
        components.append("gpu-feature-discovery")
    objects = []
    for component in components:
        name = FULLNAME if component == "device-plugin" else f"{FULLNAME}-{component}"
        labels = dict(selector)
        if values.get("componentSelectorLabels", {}).get("enabled", False):  # the component, in all three
            labels["app.kubernetes.io/component"] = component
        objects.append(_object("DaemonSet", name, {"matchLabels": labels}))
    if values.get("config", {}).get("map"):  # configmap.yml: the embedded configs, <fullname>-configs
        objects.append(_object("ConfigMap", f"{FULLNAME}-configs", None))
    return objects + _nvidia_nfd(values)


def _object(kind: str, name: str, selector: dict[str, Any] | None) -> dict[str, Any]:
    spec = {"selector": selector} if selector else {}
    return {"kind": kind, "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def _key(doc: dict[str, Any]) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace", "")


def _upgrade_problems(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    """What Helm's upgrade from `old` to `new` would fail on or delete: each of old's objects missing from new
    (deleted), and each workload whose selector changes (the API server refuses the patch)."""
    rendered = {_key(doc): doc for doc in new}
    problems = []
    for doc in old:
        found = rendered.get(_key(doc))
        if found is None:
            problems.append(f"{'/'.join(_key(doc))} would be deleted")
        elif doc["kind"] in WORKLOADS and doc["spec"]["selector"] != found["spec"]["selector"]:
            before, after = doc["spec"]["selector"], found["spec"]["selector"]
            problems.append(f"{'/'.join(_key(doc))}: spec.selector {before} -> {after}")
    return problems


def _nvidia_kept(ours: list[dict[str, Any]], nvidia: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our objects of the kinds compared (workloads, ConfigMaps, and every object NVIDIA's NFD renders)."""
    nfd = {_key(doc) for doc in nvidia}
    return [doc for doc in ours if doc["kind"] in WORKLOADS | {"ConfigMap"} or _key(doc) in nfd]


@pytest.mark.parametrize("case", list(CASES))
def test_upgrade_from_nvidia_keeps_every_workload_configmap_and_nfd_object(case: str) -> None:
    values = CASES[case]
    nvidia = _nvidia_objects(values)
    ours = _ours(values).documents()
    assert _upgrade_problems(nvidia, ours) == []


@pytest.mark.parametrize("case", list(CASES))
def test_rollback_to_nvidia_keeps_its_selectors(case: str) -> None:
    """`helm rollback` patches back to NVIDIA's objects: the selectors must not change that way either, and
    NVIDIA's objects of the kinds compared are all ours (nothing ours alone of those kinds but by design)."""
    values = CASES[case]
    nvidia = _nvidia_objects(values)
    ours = _nvidia_kept(_ours(values).documents(), nvidia)
    shared = {_key(doc) for doc in nvidia}
    assert _upgrade_problems([doc for doc in ours if _key(doc) in shared], nvidia) == []


def test_nfd_is_rendered_with_gfd_or_nfd_as_nvidias_fourteen_objects() -> None:
    nfd = _nvidia_nfd({"gfd": {"enabled": True}})
    assert len(nfd) == 14, sorted(_key(doc) for doc in nfd)
    assert _nvidia_nfd({"nfd": {"enabled": False}, "gfd": {"enabled": True}}) == []
    ours = {_key(doc) for doc in _ours({"gfd": {"enabled": True}, "nfd": {"enabled": False}}).documents()}
    assert not {_key(doc) for doc in nfd} & ours, "nfd.enabled=false is the first condition and wins"


def test_nfd_values_pass_through_to_the_subchart() -> None:
    docs = {_key(d): d for d in _ours(CASES["nfd.master-worker"]).documents()}
    master = docs["Deployment", "nvdp-node-feature-discovery-master", NAMESPACE]
    worker = docs["DaemonSet", "nvdp-node-feature-discovery-worker", NAMESPACE]
    assert master["spec"]["replicas"] == 2
    assert (
        worker["spec"]["template"]["spec"]["tolerations"]
        == CASES["nfd.master-worker"]["nfd"]["worker"]["tolerations"]
    )
    conf = docs["ConfigMap", "nvdp-node-feature-discovery-master-conf", NAMESPACE]
    assert yaml.safe_load(conf["data"]["nfd-master.conf"])["extraLabelNs"] == ["nvidia.com"]


def test_the_mps_daemonset_runs_only_on_mps_capable_nodes_unless_a_config_uses_mps() -> None:
    """Rendered as NVIDIA's is (always, with the plugin), on nodes labelled nvidia.com/mps.capable=true; where
    a config may use MPS, on every GPU node the affinity selects (the plugin waits for its daemon there)."""
    name = f"{FULLNAME}-mps-control-daemon"
    default = {_key(d): d for d in _ours({}).documents()}["DaemonSet", name, NAMESPACE]
    assert default["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/mps.capable": "true"}
    mps = {_key(d): d for d in _ours(CASES["mps"]).documents()}["DaemonSet", name, NAMESPACE]
    assert "nodeSelector" not in mps["spec"]["template"]["spec"]


def test_pods_keep_a_component_label_that_tells_the_daemonsets_apart() -> None:
    docs = [d for d in _ours(CASES["gfd.enabled"]).documents() if d["kind"] == "DaemonSet"]
    components = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
        for d in docs
        if d["metadata"]["name"].startswith(FULLNAME)
    }
    assert components == {
        FULLNAME: "device-plugin",
        f"{FULLNAME}-mps-control-daemon": "mps-control-daemon",
        f"{FULLNAME}-gpu-feature-discovery": "gpu-feature-discovery",
    }
    service = {_key(d): d for d in _ours(CASES["gfd.enabled"]).documents()}[
        "Service", f"{FULLNAME}-metrics", NAMESPACE
    ]
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "device-plugin"


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("case", list(CASES))
def test_every_object_validates_at_the_oldest_and_newest_kubernetes(case: str, version: str) -> None:
    problems = []
    for doc in _ours(CASES[case]).documents():
        if doc["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{'/'.join(_key(doc))} at {'.'.join(map(str, exc.path))}: {exc.message}")
    assert problems == []


def test_the_dependency_is_nvidias_and_the_archive_is_unchanged() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["dependencies"] == [
        {
            "name": "node-feature-discovery",
            "alias": "nfd",
            "version": "0.19.0",
            "condition": "nfd.enabled,gfd.enabled",
            "repository": "oci://registry.k8s.io/nfd/charts",
        }
    ]
    assert hashlib.sha256(NFD_ARCHIVE.read_bytes()).hexdigest() == NFD_SHA256


def test_chart_lock_is_what_helm_dependency_build_writes() -> None:
    """Helm (pkg/.../resolver.HashReq) hashes the JSON of [Chart.yaml's dependencies, the lock's]; `helm
    dependency build` refuses a Chart.lock whose digest disagrees ("Chart.lock is out of sync")."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    lock = yaml.safe_load((CHART / "Chart.lock").read_text())
    fields = ["name", "version", "repository", "condition", "tags", "enabled", "import-values", "alias"]
    required = [
        {k: dep[k] for k in fields if dep.get(k) or k in ("name", "repository")}
        for dep in chart["dependencies"]
    ]
    locked = [{k: dep[k] for k in ("name", "version", "repository")} for dep in lock["dependencies"]]
    data = json.dumps([required, locked], separators=(",", ":")).encode()
    assert lock["digest"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert locked == [{k: d[k] for k in ("name", "version", "repository")} for d in chart["dependencies"]]


@pytest.mark.parametrize("kube_version", ["1.10", "1.28", "1.37"])
def test_the_chart_installs_on_every_kubernetes_nvidias_does(kube_version: str) -> None:
    release = _install(str(CHART), "{}", kube_version)
    assert any(d["kind"] == "DaemonSet" for d in release.documents())


def test_the_chart_refuses_kubernetes_older_than_the_device_plugin_api() -> None:
    with pytest.raises(HelmFailure, match=r"kubeVersion|Kubernetes version"):
        _install(str(CHART), "{}", "1.9")


def test_notes_warn_when_nvidias_image_repository_meets_our_tag() -> None:
    """NVIDIA's values name nvcr.io/nvidia/k8s-device-plugin; with this chart's appVersion as tag that image
    does not exist, and the pods would sit in ImagePullBackOff."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    nvidia_image = yaml.safe_load((NVIDIA / "values.yaml").read_text())["image"]
    notes = _ours({"image": {**nvidia_image, "tag": ""}}).notes
    assert f"nvcr.io/nvidia/k8s-device-plugin:{chart['appVersion']} does not exist" in notes
    assert "does not exist" not in _ours({"image": {**nvidia_image, "tag": "v0.20.0"}}).notes
    assert "does not exist" not in _ours({}).notes


def test_notes_say_when_the_cluster_does_not_serve_dra() -> None:
    """DRA is gated on the API, not on kubeVersion: the install goes on; NOTES says what is missing."""
    notes = _ours({"dra": {"enabled": True}}).notes  # the stand-in API serves no resource.k8s.io
    assert "does not serve resource.k8s.io/v1" in notes
    assert "resource.k8s.io" not in _ours({}).notes

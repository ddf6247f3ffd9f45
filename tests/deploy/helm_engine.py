"""The real Helm engine (Helm v4's Go library, through helm-sdkpy) installing a chart into a stand-in API.

`helm install` is run for real: Helm renders the templates, asks the server's discovery which kinds exist,
looks for objects it would overwrite, and creates every object with a POST. The stand-in (127.0.0.1 only)
answers discovery for the kinds a device-plugin install uses, says "not found" to every lookup, and records
each object Helm creates.

`install()` returns what Helm rendered (the release manifest, as `helm template` prints it) and what it sent
to the server. The release record Helm keeps (a Secret) is answered but not recorded. No template is
evaluated here: a template error, a `fail` in the chart or an unknown kind is Helm's
own error, raised as HelmFailure with Helm's message.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from support.waiting import scaled

# Kinds the stand-in serves: (group, version) -> [(resource, kind, namespaced)].
API_RESOURCES: dict[tuple[str, str], list[tuple[str, str, bool]]] = {
    ("", "v1"): [
        ("namespaces", "Namespace", False),
        ("configmaps", "ConfigMap", True),
        ("services", "Service", True),
        ("serviceaccounts", "ServiceAccount", True),
        ("secrets", "Secret", True),
    ],
    ("apps", "v1"): [("daemonsets", "DaemonSet", True), ("deployments", "Deployment", True)],
    ("batch", "v1"): [("jobs", "Job", True)],
    ("policy", "v1"): [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    # Node Feature Discovery's subchart brings its CRDs (crds/), which Helm creates before the release.
    ("apiextensions.k8s.io", "v1"): [("customresourcedefinitions", "CustomResourceDefinition", False)],
    ("rbac.authorization.k8s.io", "v1"): [
        ("clusterroles", "ClusterRole", False),
        ("clusterrolebindings", "ClusterRoleBinding", False),
        ("roles", "Role", True),
        ("rolebindings", "RoleBinding", True),
    ],
    ("networking.k8s.io", "v1"): [("networkpolicies", "NetworkPolicy", True)],
    ("monitoring.coreos.com", "v1"): [("servicemonitors", "ServiceMonitor", True)],
    ("node.k8s.io", "v1"): [("runtimeclasses", "RuntimeClass", False)],
}
_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


class HelmFailure(Exception):
    """Helm refused the install (a template error or a `fail` in the chart); the message is Helm's."""


@dataclass
class Release:
    manifest: str  # what Helm rendered, documents separated by ---
    created: list[dict[str, Any]] = field(default_factory=list)  # what Helm POSTed, in order
    notes: str = ""

    def documents(self) -> list[dict[str, Any]]:
        # libyaml's loader where PyYAML has it: the pure-Python one took most of the chart tests' time.
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        return [doc for doc in yaml.load_all(self.manifest, Loader=loader) if doc]


def _discovery(path: str) -> Any:
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/apis":
        groups = [
            {
                "name": group,
                "versions": [{"groupVersion": f"{group}/{version}", "version": version}],
                "preferredVersion": {"groupVersion": f"{group}/{version}", "version": version},
            }
            for group, version in API_RESOURCES
            if group
        ]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    for (group, version), resources in API_RESOURCES.items():
        if path == (f"/apis/{group}/{version}" if group else f"/api/{version}"):
            return {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": [
                    {
                        "name": name,
                        "singularName": kind.lower(),
                        "namespaced": ns,
                        "kind": kind,
                        "verbs": _VERBS,
                    }
                    for name, kind, ns in resources
                ],
            }
    return None


class _StandInApi(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        if path == "/version":
            major, minor = self.server.kube_version.split(".")[:2]
            return self._answer(200, {"major": major, "minor": minor, "gitVersion": f"v{major}.{minor}.0"})
        found = _discovery(path)
        if found is not None:
            return self._answer(200, found)
        if path.endswith("/secrets"):  # Helm's release storage: no release exists yet
            return self._answer(200, {"kind": "SecretList", "apiVersion": "v1", "metadata": {}, "items": []})
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": "NotFound",
            "code": 404,
        }
        return self._answer(404, {**status, "message": f"{path} not found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > 4 << 20:
            return self._answer(413, {"kind": "Status", "code": 413, "message": "too large"})
        body = self.rfile.read(length)
        if "/secrets" in self.path.partition("?")[0]:
            # Helm's release record (protobuf, from client-go): kept nowhere, answered with a bare Secret.
            name = self.path.partition("?")[0].rstrip("/").rpartition("/")[2]
            return self._answer(201, {"kind": "Secret", "apiVersion": "v1", "metadata": {"name": name}})
        created = json.loads(body)
        with self.server.lock:
            self.server.created.append(created)
        metadata = {**created.get("metadata", {}), "uid": "0", "resourceVersion": "1"}
        return self._answer(201, {**created, "metadata": metadata})

    do_PUT = do_POST  # Helm marks its release record deployed with an update


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Helm's discovery opens a connection per API group at once (a dozen): socketserver's backlog of 5
    # dropped the rest, whose SYNs were resent a second later, a second of every install.
    request_queue_size = 64

    def __init__(self, kube_version: str) -> None:
        super().__init__(("127.0.0.1", 0), _StandInApi)
        self.kube_version = kube_version
        self.created: list[dict[str, Any]] = []
        self.lock = threading.Lock()


@contextmanager
def _stand_in_api(kube_version: str) -> Iterator[_Server]:
    server = _Server(kube_version)
    # A short poll interval: shutdown() waits for one, once per install.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="helm-stand-in-api", daemon=True
    )
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=scaled(10))


def _kubeconfig(url: str, namespace: str) -> str:
    context = {"cluster": "stand-in", "user": "nobody", "namespace": namespace}
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "stand-in", "cluster": {"server": url}}],
            "users": [{"name": "nobody", "user": {}}],
            "contexts": [{"name": "stand-in", "context": context}],
            "current-context": "stand-in",
        }
    )


def _helm() -> Any:
    """helm_sdkpy, or a failure that says why it is missing."""
    import helm_sdkpy

    return helm_sdkpy


_install_lock = threading.Lock()

# Where the xdist workers of one run share what Helm rendered (tests/deploy/conftest.py sets it): an install
# costs seconds, and each worker would otherwise render the same chart with the same values again.
_shared_renders: Path | None = None


def share_renders(directory: Path | None) -> None:
    """Keep every successful install's Release under `directory` and answer the same install from there."""
    global _shared_renders
    _shared_renders = directory


def _render_key(chart: Path, values: Mapping[str, Any] | None, *args: str) -> str:
    """The chart's every file (or archive) and every input of the install, hashed: same key, same release."""
    digest = hashlib.sha256(json.dumps([dict(values or {}), *args], sort_keys=True).encode())
    files = sorted(p for p in chart.rglob("*") if p.is_file()) if chart.is_dir() else [chart]
    for path in files:
        digest.update(f"\0{path.relative_to(chart) if chart.is_dir() else path.name}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _shared(key: str) -> Release | None:
    path = _shared_renders / f"{key}.json" if _shared_renders is not None else None
    if path is None or not path.exists():
        return None
    kept = json.loads(path.read_text())
    return Release(manifest=kept["manifest"], created=kept["created"], notes=kept["notes"])


def _share(key: str, made: Release) -> None:
    if _shared_renders is None:
        return
    # Written whole, then renamed: a worker reading at the same time sees all of it or nothing.
    fd, temporary = tempfile.mkstemp(dir=_shared_renders, suffix=".part")
    with os.fdopen(fd, "w") as out:
        json.dump({"manifest": made.manifest, "created": made.created, "notes": made.notes}, out)
    os.replace(temporary, _shared_renders / f"{key}.json")


def install(
    chart: Path,
    values: Mapping[str, Any] | None = None,
    *,
    release: str = "nvidia-device-plugin",
    namespace: str = "nvidia-device-plugin",
    kube_version: str = "1.37",
) -> Release:
    """`helm install <release> <chart> -n <namespace> -f values` against a stand-in Kubernetes."""
    key = _render_key(chart, values, release, namespace, kube_version) if _shared_renders else ""
    if key and (kept := _shared(key)) is not None:
        return kept
    made = _install(chart, values, release, namespace, kube_version)
    if key:
        _share(key, made)
    return made


def _install(
    chart: Path, values: Mapping[str, Any] | None, release: str, namespace: str, kube_version: str
) -> Release:
    helm = _helm()
    with _install_lock, _stand_in_api(kube_version) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        configuration = helm.Configuration(namespace=namespace, kubeconfig=_kubeconfig(url, namespace))
        try:
            result = asyncio.run(
                helm.Install(configuration).run(
                    release, str(chart), values=dict(values or {}), wait=False, timeout=60
                )
            )
        except helm.HelmError as exc:
            raise HelmFailure(str(exc)) from None
        with server.lock:
            created = list(server.created)
    return Release(manifest=result.get("manifest", ""), created=created, notes=_notes(result))


def _notes(result: Mapping[str, Any]) -> str:
    info = result.get("info") or {}
    return str(info.get("notes") or "")


# Helm's lint severities (pkg/chart/.../lint/support): 1 info, 2 warning, 3 error.
LINT_WARNING = 2


def lint(chart: Path) -> list[dict[str, Any]]:
    """`helm lint <chart>`: its messages (Severity, Path), errors included."""
    helm = _helm()
    offline = _kubeconfig("http://127.0.0.1:9", "default")  # lint renders without asking a cluster
    with _install_lock:
        configuration = helm.Configuration(namespace="nvidia-device-plugin", kubeconfig=offline)
        result = asyncio.run(helm.Lint(configuration).run(str(chart)))
    messages: list[dict[str, Any]] = list(result.get("Messages") or [])
    return messages + [{"Severity": 3, "Path": "", "Err": e} for e in result.get("Errors") or []]

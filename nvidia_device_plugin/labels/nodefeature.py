"""The node's labels as NFD's NodeFeature object, GFD v0.20's default output (`--use-node-feature-api`).

One object per node, written as GFD writes it (internal/lm/output.go): `nfd.k8s-sigs.io/v1alpha1`
NodeFeature named `nvidia-features-for-<node>` in the configured namespace, labelled
`nfd.node.kubernetes.io/node-name: <node>` (NFD's master applies `spec.labels` to that node), with empty
feature sets in `spec.features`. Its owners are the DaemonSet that owns this pod (the controller) and the
pod itself, so the object goes away with the DaemonSet; without a pod name, or when the pod cannot be read,
the object has no owners (GFD logs a warning and goes on).

Each pass reads the object: absent, it is created; present, its labels, spec and owners are replaced (status
and the rest of the metadata kept, resourceVersion sent back so a concurrent writer makes the update fail
rather than vanish), and nothing is written when they are already as wanted.

RBAC: `get`, `create` and `update` on `nodefeatures` (group nfd.k8s-sigs.io) in the namespace, and `get` on
`pods` there for the owners; NVIDIA's chart grants get/list/watch/create/update on nodefeatures.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as kube_client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from nvidia_device_plugin.base.errors import DevicePluginError
from nvidia_device_plugin.base.kubeapi import describe_api_error

log = logging.getLogger(__name__)

GROUP = "nfd.k8s-sigs.io"
VERSION = "v1alpha1"
PLURAL = "nodefeatures"
KIND = "NodeFeature"
NAME_PREFIX = "nvidia-features-for"
NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"  # NFD's NodeFeatureObjNodeNameLabel
_TIMEOUT = (10, 30)  # connect, read: every request is bounded
_NOT_FOUND = 404


class NodeFeatureError(DevicePluginError):
    """The NodeFeature object could not be read or written (the message says which request and why)."""


@dataclass(frozen=True)
class NodeFeatureTarget:
    node_name: str
    namespace: str

    @property
    def name(self) -> str:
        return f"{NAME_PREFIX}-{self.node_name}"


def api_client(kubeconfig: str) -> Any:
    """A client from `kubeconfig`, or in the cluster from the pod's service account (as GFD: --kubeconfig
    or KUBECONFIG, else in-cluster)."""
    try:
        if kubeconfig:
            return kube_config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        configuration = kube_client.Configuration()
        kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return kube_client.ApiClient(configuration)
    except (kube_config.ConfigException, OSError, ValueError) as exc:
        raise NodeFeatureError(f"no Kubernetes API credentials for the NodeFeature API: {exc}") from exc


def owner_references(api: Any, namespace: str, pod_name: str) -> list[dict[str, Any]]:
    """The owners GFD gives the object: this pod's DaemonSet (controller) and the pod; [] when unknown."""
    if not pod_name:
        log.info("NodeFeature: no pod name (POD_NAME), so the object gets no owner references")
        return []
    try:
        # _preload_content=False: the urllib3 response itself (the annotation says V1Pod).
        response: Any = kube_client.CoreV1Api(api).read_namespaced_pod(
            pod_name, namespace, _preload_content=False, _request_timeout=_TIMEOUT
        )
        pod = json.loads(response.data)
    except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
        log.warning("NodeFeature: cannot read pod %s/%s for owner references: %s", namespace, pod_name, exc)
        return []
    metadata = pod.get("metadata") or {}
    owners = [o for o in metadata.get("ownerReferences") or [] if o.get("kind") == "DaemonSet"]
    if not owners:
        log.info("NodeFeature: pod %s is not owned by a DaemonSet; no owner references", pod_name)
        return []
    daemonset = owners[0]
    return [
        {k: daemonset.get(k) for k in ("apiVersion", "kind", "name", "uid")} | {"controller": True},
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": metadata.get("name", pod_name),
            "uid": metadata.get("uid"),
        },
    ]


def new_object(
    target: NodeFeatureTarget, labels: Mapping[str, str], owners: list[dict[str, Any]]
) -> dict[str, Any]:
    """The object GFD creates (status empty: NFD's newest CRD requires the field, older ones drop it)."""
    metadata: dict[str, Any] = {"name": target.name, "namespace": target.namespace}
    metadata.update(_owned_metadata(target, owners))
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": _spec(labels),
        "status": {},
    }


def updated_object(
    existing: dict[str, Any],
    target: NodeFeatureTarget,
    labels: Mapping[str, str],
    owners: list[dict[str, Any]],
) -> dict[str, Any] | None:
    """`existing` with GFD's labels, spec and owners; None when it already has them."""
    updated = copy.deepcopy(existing)
    metadata = updated.setdefault("metadata", {})
    for key, value in _owned_metadata(target, owners).items():
        metadata[key] = value
    if not owners:
        metadata.pop("ownerReferences", None)
    updated["spec"] = _spec(labels)
    return None if _same(existing, updated) else updated


def _owned_metadata(target: NodeFeatureTarget, owners: list[dict[str, Any]]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"labels": {NODE_NAME_LABEL: target.node_name}}
    if owners:
        metadata["ownerReferences"] = owners
    return metadata


def _spec(labels: Mapping[str, str]) -> dict[str, Any]:
    return {"features": {"flags": {}, "attributes": {}, "instances": {}}, "labels": dict(labels)}


def _same(existing: dict[str, Any], updated: dict[str, Any]) -> bool:
    """Equal as apimachinery's Semantic.DeepEqual sees these fields (a missing map is an empty one)."""

    def view(obj: dict[str, Any]) -> tuple[object, ...]:
        metadata = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        features = spec.get("features") or {}
        return (
            metadata.get("labels") or {},
            metadata.get("ownerReferences") or [],
            {k: features.get(k) or {} for k in ("flags", "attributes", "instances")},
            spec.get("labels") or {},
        )

    return view(existing) == view(updated)


class NodeFeaturePublisher:
    """Creates or updates the node's NodeFeature object; `publish` says what it did."""

    def __init__(self, api: Any, target: NodeFeatureTarget, owners: list[dict[str, Any]]) -> None:
        self._api = kube_client.CustomObjectsApi(api)
        self.target = target
        self._owners = owners

    def describe(self) -> str:
        return f"NodeFeature {self.target.namespace}/{self.target.name}"

    def publish(self, labels: Mapping[str, str]) -> str:
        """What it did ("created", "updated", "unchanged"); NodeFeatureError when the API refuses or fails."""
        existing = self._get()
        if existing is None:
            self._call(
                "creating",
                self._api.create_namespaced_custom_object,
                new_object(self.target, labels, self._owners),
            )
            return "created"
        updated = updated_object(existing, self.target, labels, self._owners)
        if updated is None:
            return "unchanged"
        self._call("updating", self._api.replace_namespaced_custom_object, self.target.name, updated)
        return "updated"

    def _get(self) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self._call(
                "reading", self._api.get_namespaced_custom_object, self.target.name
            )
        except _Missing:
            return None
        return found

    def _call(self, doing: str, method: Any, *args: Any) -> Any:
        target = self.target
        try:
            return method(GROUP, VERSION, target.namespace, PLURAL, *args, _request_timeout=_TIMEOUT)
        except ApiException as exc:
            if exc.status == _NOT_FOUND and method == self._api.get_namespaced_custom_object:
                raise _Missing from exc  # no object yet
            hint = (
                " (is NFD's nodefeatures.nfd.k8s-sigs.io CRD installed?)" if exc.status == _NOT_FOUND else ""
            )
            raise NodeFeatureError(
                f"{doing} {self.describe()} failed: {describe_api_error(exc)}{hint}"
            ) from exc
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise NodeFeatureError(f"{doing} {self.describe()} failed: {exc}") from exc


class _Missing(Exception):
    """The object does not exist (yet)."""

"""The API calls the DRA mode makes, and nothing else: this node's ResourceSlices and the Node's UID.

Only this module (of dra/) imports the `kubernetes` client, and only in the DRA mode. Calls, and so the
ClusterRole the daemon needs (docs/dra.md, "RBAC"):

* resource.k8s.io resourceslices: list (fieldSelector spec.nodeName=<node>,spec.driver=gpu.nvidia.com),
  create, update, delete;
* core nodes: get (the owner reference's UID).

Every call has a connect and a read timeout; failures are SliceApiError with the status and reason.
"""

from __future__ import annotations

from typing import Any

from nvidia_device_plugin.base.errors import DevicePluginError
from nvidia_device_plugin.dra.attributes import Json
from nvidia_device_plugin.dra.names import DRIVER_NAME

GROUP, VERSION, PLURAL = "resource.k8s.io", "v1", "resourceslices"
TIMEOUT_S = (10, 30)  # (connect, read)


class SliceApiError(DevicePluginError):
    """The API server refused or failed a request (the message says which and why)."""


def _describe(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None) or str(exc)
    return f"{status} {reason}" if status else reason


def _mapping(answer: object) -> Json:
    if not isinstance(answer, dict):
        raise SliceApiError(f"the API server answered {type(answer).__name__}, not an object")
    return answer


class KubeSliceApi:
    """SliceApi over the `kubernetes` client (an ApiClient made by the caller: in-cluster or kubeconfig)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._objects = client.CustomObjectsApi(api_client)
        self._api_client = api_client
        self._client = client

    def node_uid(self, node: str) -> str:
        # The one core-group call, made through the ApiClient as the generated CoreV1Api.read_node makes
        # it: importing CoreV1Api and its models would cost every DRA-mode start about half a second.
        api = self._api_client
        try:
            request = api.param_serialize(
                method="GET",
                resource_path="/api/v1/nodes/{name}",
                path_params={"name": node},
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = api.call_api(*request, _request_timeout=TIMEOUT_S)
            response.read()
            answer = api.response_deserialize(response, {"200": "object"}).data
        except Exception as exc:
            raise SliceApiError(
                f"reading node {node} (for the slices' owner) failed: {_describe(exc)}"
            ) from exc
        meta = _mapping(answer).get("metadata")
        return str(meta.get("uid") or "") if isinstance(meta, dict) else ""

    def list(self, node: str) -> list[Json]:
        selector = f"spec.nodeName={node},spec.driver={DRIVER_NAME}"
        try:
            answer = self._objects.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, field_selector=selector, _request_timeout=TIMEOUT_S
            )
        except Exception as exc:
            raise SliceApiError(
                f"listing the ResourceSlices of node {node} failed: {_describe(exc)}"
            ) from exc
        return list(_mapping(answer).get("items") or [])

    def create(self, obj: Json) -> Json:
        try:
            return _mapping(
                self._objects.create_cluster_custom_object(
                    GROUP, VERSION, PLURAL, obj, _request_timeout=TIMEOUT_S
                )
            )
        except Exception as exc:
            raise SliceApiError(f"creating a ResourceSlice failed: {_describe(exc)}") from exc

    def update(self, obj: Json) -> Json:
        name = obj["metadata"]["name"]
        try:
            return _mapping(
                self._objects.replace_cluster_custom_object(
                    GROUP, VERSION, PLURAL, name, obj, _request_timeout=TIMEOUT_S
                )
            )
        except Exception as exc:
            raise SliceApiError(f"updating ResourceSlice {name} failed: {_describe(exc)}") from exc

    def delete(self, name: str, uid: str, resource_version: str) -> None:
        options = self._client.V1DeleteOptions(
            preconditions=self._client.V1Preconditions(
                uid=uid or None, resource_version=resource_version or None
            )
        )
        try:
            self._objects.delete_cluster_custom_object(
                GROUP, VERSION, PLURAL, name, body=options, _request_timeout=TIMEOUT_S
            )
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return  # gone already
            raise SliceApiError(f"deleting ResourceSlice {name} failed: {_describe(exc)}") from exc

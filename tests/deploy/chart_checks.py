"""Checks of a rendered install shared by the chart tests of GFD and the DRA mode: what its RBAC grants, read
as the API server's authorizer reads it; a container's env as the kubelet sets it; every object against the
newest Kubernetes schema."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils

KUBERNETES_VERSION = kubernetes_validate.utils.latest_version()

_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?$"
)
_VERBS = {"POST": "create", "PUT": "update", "DELETE": "delete", "PATCH": "patch"}


def request_verb(method: str, path: str) -> tuple[str, str, str | None, str]:
    """(API group, resource, namespace or None, verb) of one HTTP request, as the authorizer names it."""
    match = _PATH.match(path.partition("?")[0])
    assert match, f"not an API path: {path}"
    verb = ("get" if match["name"] else "list") if method == "GET" else _VERBS[method]
    return match["group"] or "", match["plural"], match["ns"], verb


def allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]
        for rule in rules
    )


def field_refs(container: dict[str, Any]) -> dict[str, str]:
    """The container's env set from the downward API: name -> fieldPath."""
    return {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in container.get("env", [])
        if "fieldRef" in e.get("valueFrom", {})
    }


def pod_env(container: dict[str, Any], fields: dict[str, str]) -> dict[str, str]:
    """The container's env with each downward-API field resolved from `fields` (fieldPath -> value)."""
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    for name, path in field_refs(container).items():
        env[name] = fields[path]
    return env


def schema_problems(documents: Iterable[dict[str, Any]]) -> list[str]:
    """One line per object that does not validate at KUBERNETES_VERSION (strict: no unknown fields)."""
    problems = []
    for doc in documents:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path) or "the top"
            problems.append(f"{doc['kind']}/{doc['metadata']['name']} at {where}: {exc.message}")
    return problems

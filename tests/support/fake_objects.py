"""Namespaced objects for the stand-in API server: GET, POST (create) and PUT (replace), answered as the API
server answers them.

Objects live under their API path (`/apis/<group>/<version>/namespaces/<ns>/<plural>/<name>`, or
`/api/v1/namespaces/<ns>/<plural>/<name>` for the core group). A create sets uid, resourceVersion and the
namespace, and refuses a name that exists (409 AlreadyExists); a replace refuses a stale resourceVersion
(409 Conflict) and an object that does not exist (404); both validate the body with the JSON schema
registered for the plural, if any (422 Invalid, naming each error), as the API server checks a CRD's
openAPIV3Schema; a plural in `uninstalled` is a CRD that is not installed. Tests seed objects (`put`),
read them (`get`) and see every request (`requests`).
"""

from __future__ import annotations

import copy
import itertools
import re
import threading
import uuid
from typing import Any

import jsonschema

_PATH = re.compile(
    r"^/(?:api/v1|apis/[^/]+/[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?$"
)

Answer = tuple[int, dict[str, Any]]


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message}  # fmt: skip


class ObjectStore:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.schemas: dict[str, dict[str, Any]] = {}  # plural -> JSON schema of its objects
        self.uninstalled: set[str] = set()  # plurals whose CRD is not installed: every request is a 404
        self.requests: list[tuple[str, str]] = []  # (method, path), in order
        self._versions = itertools.count(1000)
        self._lock = threading.Lock()

    @staticmethod
    def serves(path: str) -> bool:
        return _PATH.match(path) is not None

    def put(self, path: str, obj: dict[str, Any]) -> None:
        """Seed an object as if it had been created (resourceVersion and uid set when missing)."""
        with self._lock:
            stored = copy.deepcopy(obj)
            metadata = stored.setdefault("metadata", {})
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata["resourceVersion"] = str(next(self._versions))
            self.objects[path] = stored

    def get(self, path: str) -> dict[str, Any] | None:
        with self._lock:
            found = self.objects.get(path)
            return copy.deepcopy(found) if found is not None else None

    def answer(self, method: str, path: str, body: dict[str, Any] | None) -> Answer:
        self.requests.append((method, path))
        match = _PATH.match(path)
        if match is None:
            return 404, status(404, "NotFound", f"unexpected {method} {path}")
        if match["plural"] in self.uninstalled:
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        with self._lock:
            if method == "GET":
                return self._read(path, match)
            if method == "POST" and match["name"] is None and body is not None:
                return self._create(path, match, body)
            if method == "PUT" and match["name"] is not None and body is not None:
                return self._replace(path, match, body)
        return 405, status(405, "MethodNotAllowed", f"{method} {path} is not served")

    def _read(self, path: str, match: re.Match[str]) -> Answer:
        found = self.objects.get(path)
        if found is None:
            return 404, status(404, "NotFound", f'{match["plural"]} "{match["name"]}" not found')
        return 200, copy.deepcopy(found)

    def _create(self, collection: str, match: re.Match[str], body: dict[str, Any]) -> Answer:
        name = (body.get("metadata") or {}).get("name")
        invalid = self._invalid(match["plural"], body)
        if invalid:
            return invalid
        path = f"{collection}/{name}"
        if path in self.objects:
            return 409, status(409, "AlreadyExists", f'{match["plural"]} "{name}" already exists')
        stored = copy.deepcopy(body)
        metadata = stored["metadata"]
        version = str(next(self._versions))
        metadata.update(namespace=match["ns"], uid=str(uuid.uuid4()), resourceVersion=version)
        self.objects[path] = stored
        return 201, copy.deepcopy(stored)

    def _replace(self, path: str, match: re.Match[str], body: dict[str, Any]) -> Answer:
        existing = self.objects.get(path)
        if existing is None:
            return 404, status(404, "NotFound", f'{match["plural"]} "{match["name"]}" not found')
        invalid = self._invalid(match["plural"], body)
        if invalid:
            return invalid
        sent = (body.get("metadata") or {}).get("resourceVersion")
        if sent and sent != existing["metadata"]["resourceVersion"]:
            message = "the object has been modified; please apply your changes to the latest version"
            return 409, status(409, "Conflict", message)
        stored = copy.deepcopy(body)
        stored["metadata"].update(uid=existing["metadata"]["uid"], resourceVersion=str(next(self._versions)))
        self.objects[path] = stored
        return 200, copy.deepcopy(stored)

    def _invalid(self, plural: str, body: dict[str, Any]) -> Answer | None:
        schema = self.schemas.get(plural)
        if schema is None:
            return None
        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(body), key=lambda e: e.json_path)
        if not errors:
            return None
        message = "; ".join(f"{e.json_path}: {e.message}" for e in errors)
        return 422, status(422, "Invalid", message)

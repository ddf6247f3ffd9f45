"""A stand-in Kubernetes API server (127.0.0.1 only) for the node list and watch API, over real HTTP.

It answers `GET /api/v1/nodes?fieldSelector=metadata.name=<node>` with a NodeList, and the same with
`watch=true` with a stream of JSON lines (`{"type": "MODIFIED", "object": <Node>}`) that a test feeds:
label changes, a stream end (the client reconnects from the last resourceVersion), and an ERROR event with
a 410 Status (the client lists again). Every loop is bounded and the server stops on exit.

Namespaced objects (a NodeFeature, a Pod) are served by `objects` (support/fake_objects.py): GET, and POST and
PUT validated against the JSON schema registered for their kind.

ResourceClaims (resource.k8s.io/v1) are served by `ResourceClaims` (the `claims` attribute, asked first): `GET
/apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>` answers the claim a test put there, 404
for one it did not, or the failure a test set.
"""

from __future__ import annotations

import contextlib
import copy
import json
import queue
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from support.fake_objects import ObjectStore, status

NODE = "gpu-node-1"
LABEL = "nvidia.com/device-plugin.config"
CLOSE_STREAM = object()  # fed to the watch queue: end the current stream


class _JsonHandler(BaseHTTPRequestHandler):
    """A quiet HTTP/1.1 handler that answers JSON with a Content-Length, as the API server answers."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _LocalServer:
    """An HTTP server on 127.0.0.1 (an ephemeral port) and its thread; as a context manager it serves
    inside the block, and on exit sets `stopping` (for the handlers' loops), shuts down and joins."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], name: str) -> None:
        self.stopping = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), name=name)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


class FakeApiServer(_LocalServer):
    def __init__(self, labels: dict[str, str]) -> None:
        self.version = 100
        self.node: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "uid": "3f1c", "resourceVersion": "100", "labels": dict(labels)},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
        self.requests: list[dict[str, list[str]]] = []  # query of each node request, in order
        self.list_times: list[float] = []  # time.monotonic() as each list of the node came in
        self.objects = ObjectStore()
        self.claims = ResourceClaims()
        self.feed: queue.Queue[object] = queue.Queue()
        self.lock = threading.Lock()
        super().__init__(self._handler(), "fake-apiserver")

    def set_label(self, value: str | None, announce: bool = True) -> None:
        """Change the node; `announce` sends the MODIFIED event to the watch (False: the event is lost)."""
        with self.lock:
            self.version += 1
            labels = self.node["metadata"]["labels"]
            if value is None:
                labels.pop(LABEL, None)
            else:
                labels[LABEL] = value
            self.node["metadata"]["resourceVersion"] = str(self.version)
            event = {"type": "MODIFIED", "object": copy.deepcopy(self.node)}
        if announce:
            self.feed.put(event)

    def expire_watch(self) -> None:
        self.feed.put(
            {
                "type": "ERROR",
                "object": {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "message": "too old resource version: 100 (105)",
                    "reason": "Expired",
                    "code": 410,
                },
            }
        )

    def lists(self) -> list[dict[str, list[str]]]:
        return [q for q in list(self.requests) if q.get("watch") != ["true"]]

    def watches(self) -> list[dict[str, list[str]]]:
        return [q for q in list(self.requests) if q.get("watch") == ["true"]]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(_JsonHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if (answer := fake.claims.answer(url.path)) is not None:
                    self._send(*answer)
                    return
                if fake.objects.serves(url.path):
                    self._send(*fake.objects.answer("GET", url.path, None))
                    return
                query = parse_qs(url.query)
                if query.get("watch") != ["true"]:
                    fake.list_times.append(time.monotonic())
                fake.requests.append(query)
                if url.path != "/api/v1/nodes" or query.get("fieldSelector") != [f"metadata.name={NODE}"]:
                    self._send(404, {"kind": "Status", "code": 404, "message": f"unexpected {self.path}"})
                elif query.get("watch") == ["true"]:
                    self._stream()
                else:
                    with fake.lock:
                        body = {
                            "kind": "NodeList",
                            "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(fake.version)},
                            "items": [copy.deepcopy(fake.node)],
                        }
                    self._send(200, body)

            def do_POST(self) -> None:
                self._write("POST")

            def do_PUT(self) -> None:
                self._write("PUT")

            def _write(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length)) if length else None
                except ValueError:
                    body = None
                self._send(*fake.objects.answer(method, urlsplit(self.path).path, body))

            def _client_gone(self) -> bool:
                readable, _, _ = select.select([self.connection], [], [], 0)
                if not readable:
                    return False
                try:
                    return self.connection.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    return True

            def _stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")  # as the API server streams a watch
                self.end_headers()
                self.close_connection = True
                try:
                    while not fake.stopping.is_set():
                        if self._client_gone():
                            return  # as the API server: a watch whose client hung up takes no more events
                        try:
                            item = fake.feed.get(timeout=0.05)
                        except queue.Empty:
                            continue
                        if item is CLOSE_STREAM:
                            return
                        line = json.dumps(item).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                        if isinstance(item, dict) and item["type"] == "ERROR":
                            return  # the API server ends the stream after an ERROR event
                except OSError:
                    return  # the client hung up between two events
                finally:
                    # Unless the client hung up first (socketserver would print the broken pipe to stderr).
                    with contextlib.suppress(OSError):
                        self.wfile.write(b"0\r\n\r\n")

        return Handler


class ResourceClaims:
    """The ResourceClaims the stand-in serves, by namespace and name; `reads` records each GET."""

    PREFIX = "/apis/resource.k8s.io/v1/namespaces/"

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stored: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads: list[tuple[str, str]] = []
        self.failure: tuple[int, str] | None = None  # (HTTP status, message) every read answers instead

    def put(self, claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        with self.lock:
            self.stored[(meta["namespace"], meta["name"])] = copy.deepcopy(claim)

    def delete(self, namespace: str, name: str) -> None:
        with self.lock:
            self.stored.pop((namespace, name), None)

    def answer(self, path: str) -> tuple[int, dict[str, Any]] | None:
        """(status, body) for a claim's path; None for any other path (the other routes answer it)."""
        parts = path.removeprefix(self.PREFIX).split("/")
        if not path.startswith(self.PREFIX) or len(parts) != 3 or parts[1] != "resourceclaims":
            return None
        namespace, _, name = parts
        with self.lock:
            self.reads.append((namespace, name))
            if self.failure is not None:
                code, message = self.failure
                return code, status(code, "InternalError" if code >= 500 else "Forbidden", message)
            claim = self.stored.get((namespace, name))
        if claim is None:
            message = f'resourceclaims.resource.k8s.io "{name}" not found'
            return 404, status(404, "NotFound", message)
        return 200, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", **claim}


def write_kubeconfig(path: Path, server_url: str) -> Path:
    """A kubeconfig naming the stand-in, for processes that find the API as kubectl does ($KUBECONFIG)."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server_url}}],
                "users": [{"name": "nobody", "user": {}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "nobody"}}],
                "current-context": "fake",
            }
        )
    )
    return path


# ---- ResourceSlices (the DRA mode's publisher) ----------------------------------------------------------

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"


class FakeResourceSliceApi(_LocalServer):
    """A stand-in API server (127.0.0.1) for ResourceSlices and the one Node they belong to, over real
    HTTP: list (with the fieldSelector the publisher sends), create (generateName), update (optimistic
    concurrency on resourceVersion), delete (uid/resourceVersion preconditions), get node. Every write is
    recorded; `on_write` (if set) is called after each one, under the store's lock, with the slices now
    stored, so a test can check an invariant at the very moment a slice changes. `fail_next(n, code)`
    answers the next n writes with that status."""

    def __init__(self, node: str = NODE) -> None:
        self.node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "uid": "node-uid-1"}}
        self.slices: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []  # (verb, slice name), in order
        self.on_write: Any = None
        self.lock = threading.Lock()
        self._version = 1000
        self._failures: list[int] = []
        super().__init__(self._handler(), "fake-slices-api")

    def fail_next(self, count: int, code: int = 500) -> None:
        with self.lock:
            self._failures += [code] * count

    def current(self) -> list[dict[str, Any]]:
        """The slices of the highest pool generation: what a scheduler uses."""
        with self.lock:
            return _current(self.slices)

    def devices(self) -> dict[str, dict[str, Any]]:
        """Device name -> device, over the current slices."""
        return {d["name"]: d for s in self.current() for d in s["spec"].get("devices") or []}

    def _write(self, verb: str, name: str) -> None:
        self.writes.append((verb, name))
        if self.on_write is not None:
            self.on_write(_current(self.slices))

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        with self.lock:
            if method != "GET" and self._failures:
                code = self._failures.pop(0)
                return code, {"kind": "Status", "code": code, "message": "injected failure"}
            if method == "GET" and path == f"/api/v1/nodes/{self.node['metadata']['name']}":
                return 200, self.node
            if path == SLICES_PATH and method == "GET":
                return 200, self._list(query)
            if path == SLICES_PATH and method == "POST":
                return self._create(body)
            name = path.removeprefix(SLICES_PATH + "/")
            if path.startswith(SLICES_PATH + "/") and method == "PUT":
                return self._update(name, body)
            if path.startswith(SLICES_PATH + "/") and method == "DELETE":
                return self._delete(name, body)
        return 404, {"kind": "Status", "code": 404, "message": f"unexpected {method} {path}"}

    def _list(self, query: dict[str, list[str]]) -> dict[str, Any]:
        wanted = dict(part.split("=", 1) for part in query.get("fieldSelector", [""])[0].split(",") if part)
        items = [
            copy.deepcopy(s)
            for s in self.slices.values()
            if all(_field(s, key) == value for key, value in wanted.items())
        ]
        return {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1", "items": items}

    def _create(self, body: dict[str, Any]) -> tuple[int, Any]:
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        name = meta.get("name") or f"{meta['generateName']}{len(self.writes):05d}"
        if name in self.slices:
            return 409, {"kind": "Status", "code": 409, "message": f"{name} exists"}
        meta.update(name=name, uid=f"uid-{name}", resourceVersion=self._next_version())
        self.slices[name] = obj
        self._write("create", name)
        return 201, copy.deepcopy(obj)

    def _update(self, name: str, body: dict[str, Any]) -> tuple[int, Any]:
        stored = self.slices.get(name)
        if stored is None:
            return 404, {"kind": "Status", "code": 404, "message": f"{name} not found"}
        if body["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
            return 409, {"kind": "Status", "code": 409, "message": "the object has been modified"}
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = self._next_version()
        self.slices[name] = obj
        self._write("update", name)
        return 200, copy.deepcopy(obj)

    def _delete(self, name: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        stored = self.slices.get(name)
        if stored is None:
            return 404, {"kind": "Status", "code": 404, "message": f"{name} not found"}
        pre = (body or {}).get("preconditions") or {}
        meta = stored["metadata"]
        if pre.get("uid") not in (None, meta["uid"]) or pre.get("resourceVersion") not in (
            None,
            meta["resourceVersion"],
        ):
            return 409, {"kind": "Status", "code": 409, "message": "precondition failed"}
        del self.slices[name]
        self._write("delete", name)
        return 200, {"kind": "Status", "status": "Success"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(_JsonHandler):
            def _answer(self, method: str) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                self._send(*fake.handle(method, url.path, parse_qs(url.query), body))

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def do_PUT(self) -> None:
                self._answer("PUT")

            def do_DELETE(self) -> None:
                self._answer("DELETE")

        return Handler


def _field(obj: dict[str, Any], dotted: str) -> object:
    value: Any = obj
    for key in dotted.split("."):
        value = (value or {}).get(key)
    return value


def _current(slices: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    generation = max((s["spec"]["pool"]["generation"] for s in slices.values()), default=0)
    return [copy.deepcopy(s) for s in slices.values() if s["spec"]["pool"]["generation"] == generation]

"""The node's label from the Kubernetes API: one list, then a watch from the list's resourceVersion.

Only this module imports the `kubernetes` client. Two commands import it: `config-manager`, and `run` with
`--node-config-label`, whose node-label follower (configmanager/inprocess.py) reads the API on its own
thread; nothing on the Allocate path ever talks to the API, and `run` without the flag never imports it.

Both requests are `list nodes` with `fieldSelector=metadata.name=<node>` (the second with `watch=true`), so
the ClusterRole needs `list` and `watch` on `nodes` and nothing else. The watch is read as raw JSON lines
rather than through `kubernetes.watch.Watch`, because the caller has to tell three endings apart: the server
closing the stream (reconnect from the last resourceVersion seen), `410 Gone` (that version is too old:
list again), and any other failure (back off, then list again).

Every request has timeouts (API_CONNECT_TIMEOUT_S to connect, API_READ_TIMEOUT_S for each wait on a list's
answer, WATCH_READ_TIMEOUT_S on a watch's) and urllib3's silent retries are off, so a server that accepts
and never answers costs one bounded wait that the caller logs.

Two bounds keep a misbehaving or hostile API answer from hurting the node. A list after `410 Gone` waits
as client-go's reflector waits before it lists again (RelistBackoff: 0.8 s doubling to 30 s, each delay
stretched by up to as much again at random, back to 0.8 s after 2 minutes without one), so an API server
that expires every watch costs a request every 30-60 s, not 40 a second. And no answer is read past
MAX_EVENT_BYTES: a list body or a watch line (one event) larger than that is refused with an error that
says so, and the caller lists again after its backoff; lines are split as they arrive, in linear time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as kube_client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from nvidia_device_plugin.base.errors import DevicePluginError
from nvidia_device_plugin.base.kubeapi import describe_api_error

log = logging.getLogger(__name__)

HTTP_GONE = 410
# A Node object is at most what etcd stores (1.5 MiB by default); 8 MiB of JSON is far past any real one.
MAX_EVENT_BYTES = 8 * 1024 * 1024
# client-go's reflector: wait.NewExponentialBackoffManager(800ms, 30s, 2min, 2.0, 1.0).
RELIST_INITIAL_S = 0.8
RELIST_CAP_S = 30.0
RELIST_RESET_S = 120.0
# An error answer's body is read for its Status message only.
MAX_ERROR_BODY_BYTES = 64 * 1024
# Asked of the server, which ends each watch after this long; the client then reconnects, which also bounds
# how long a half-open connection (a vanished API server) can go unnoticed.
WATCH_SECONDS = 300
# Every request is bounded: connecting, and each wait for the answer's next bytes. urllib3's own retries are
# off (they repeated a read that timed out three times more, silently): the callers retry, logging why.
API_CONNECT_TIMEOUT_S = 5.0
API_READ_TIMEOUT_S = 10.0  # a list: the API server answers one node within a second
# A watch read may wait a whole watch period for the next event; the margin covers a slow server.
WATCH_READ_TIMEOUT_S = WATCH_SECONDS + 30


class NodeApiError(DevicePluginError):
    """The API server refused or failed a request (the message says which and why)."""


class RelistBackoff:
    """How long to wait before listing again after `410 Gone`, as client-go's reflector does."""

    def __init__(self, initial_s: float = RELIST_INITIAL_S) -> None:
        self._initial = initial_s
        self._cap = RELIST_CAP_S
        self._reset = RELIST_RESET_S
        self._next = self._initial
        self._last: float | None = None

    def reset(self) -> None:
        """Start again from the first delay (what came before went well)."""
        self._next = self._initial
        self._last = None

    def delay(self) -> float:
        now = time.monotonic()
        if self._last is None or now - self._last > self._reset:
            self._next = self._initial
        self._last = now
        base, self._next = self._next, min(self._next * 2, self._cap)
        return base * (1 + random.random())  # jitter 1.0: anywhere in [base, 2 x base)


class WatchExpired(NodeApiError):
    """410 Gone: the resourceVersion the watch started from is no longer served; list again."""


@dataclass(frozen=True)
class NodeState:
    # "" when the node does not carry the label; None after a watch BOOKMARK, which carries only a version
    label_value: str | None
    resource_version: str


def api_client_from_environment(kubeconfig: str = "") -> Any:
    """`kubeconfig` if given (config-manager's --kubeconfig); else in a pod the service account, elsewhere
    $KUBECONFIG or ~/.kube/config (as kubectl)."""
    configuration = kube_client.Configuration()
    try:
        if kubeconfig:
            kube_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration
            )
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            kube_config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (kube_config.ConfigException, OSError, ValueError, TypeError, AttributeError) as exc:
        # A kubeconfig of the wrong shape fails inside the library with any of these: name the file instead.
        raise NodeApiError(f"no Kubernetes API credentials: {exc}") from exc
    return _client(configuration)


def api_client_for(host: str) -> Any:
    """A client for an API server at `host` without credentials (tests, `kubectl proxy`)."""
    configuration = kube_client.Configuration()
    configuration.host = host
    return _client(configuration)


def _client(configuration: Any) -> Any:
    configuration.retries = False  # see API_READ_TIMEOUT_S
    return kube_client.ApiClient(configuration)


def _mapping(value: object, what: str) -> dict[str, Any]:
    """`value` when it is a JSON object (or absent: empty); NodeApiError naming `what` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise NodeApiError(f"{what} is a {_json_kind(value)}, not an object")
    return value


def _json_kind(value: object) -> str:
    return {str: "string", list: "list", bool: "boolean", int: "number", float: "number"}.get(
        type(value), type(value).__name__
    )


def _label_of(node: object, label: str, what: str) -> str:
    """The value of `label` on the Node object `node` ("" when it has none); NodeApiError when `node` is not
    shaped as a Node."""
    metadata = _mapping(_mapping(node, what).get("metadata"), f"{what}'s metadata")
    value = _mapping(metadata.get("labels"), f"{what}'s metadata.labels").get(label, "")
    if not isinstance(value, str):
        raise NodeApiError(f"{what}'s label {label} is a {_json_kind(value)}, not a string")
    return value


def _state_from_list(body: object, node_name: str, label: str) -> NodeState:
    """The node's state in a NodeList answer; NodeApiError naming what is wrong with any other answer."""
    what = f"the list of node {node_name}"
    answer = _mapping(body, what)
    items = answer.get("items") or []
    if not isinstance(items, list):
        raise NodeApiError(f"{what} is malformed: items is a {_json_kind(items)}, not a list")
    if not items:
        raise NodeApiError(f"node {node_name} does not exist (check NODE_NAME)")
    version = str(_mapping(answer.get("metadata"), f"{what}'s metadata").get("resourceVersion") or "")
    return NodeState(_label_of(items[0], label, f"node {node_name} in {what}"), version)


class NodeLabelReader:
    """Reads one label of one node; `list_state()` once, then `watch(from_version)` over and over."""

    def __init__(
        self, api_client: Any, node_name: str, label: str, relist_initial_s: float = RELIST_INITIAL_S
    ) -> None:
        self._client = api_client
        self._node_name = node_name
        self._label = label
        self._selector = f"metadata.name={node_name}"
        self._lock = threading.Lock()  # guards the two below between the reading thread and interrupt()
        self._stream: Any = None  # the watch response being read
        self._interrupted = False
        self._woken = threading.Event()  # set by interrupt(): a backoff wait ends at once
        self._relist = RelistBackoff(relist_initial_s)
        self._expired = False  # the last watch ended in 410 Gone: the next list waits its backoff first

    def list_state(self) -> NodeState:
        if self._expired:
            self._expired = False
            delay = self._relist.delay()
            log.debug("listing node %s again in %.1fs (its watch expired)", self._node_name, delay)
            self._woken.wait(delay)
        try:
            response = self._get([], (API_CONNECT_TIMEOUT_S, API_READ_TIMEOUT_S))
            body = json.loads(_read_bounded(response, f"the list of node {self._node_name}"))
        except ApiException as exc:
            raise NodeApiError(f"listing node {self._node_name} failed: {describe_api_error(exc)}") from exc
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise NodeApiError(f"listing node {self._node_name} failed: {exc}") from exc
        return _state_from_list(body, self._node_name, self._label)

    def watch(self, from_version: str) -> Iterator[NodeState]:
        """The node's state after each change, until the server ends the stream (then return)."""
        try:
            query = [
                ("watch", "true"),
                ("resourceVersion", from_version),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", str(WATCH_SECONDS)),
            ]
            stream = self._get(query, (API_CONNECT_TIMEOUT_S, WATCH_READ_TIMEOUT_S))
        except ApiException as exc:
            if exc.status == HTTP_GONE:
                self._expired = True
                raise WatchExpired(
                    f"watch from resourceVersion {from_version}: {describe_api_error(exc)}"
                ) from exc
            raise NodeApiError(f"watching node {self._node_name} failed: {describe_api_error(exc)}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise NodeApiError(f"watching node {self._node_name} failed: {exc}") from exc
        with self._lock:
            self._stream, interrupted = stream, self._interrupted
        if interrupted:
            _shut_down(stream)
        try:
            yield from self._events(stream, from_version)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise NodeApiError(f"watch of node {self._node_name} broke off: {exc}") from exc
        finally:
            with self._lock:
                self._stream = None
            # Closed, not just handed back: a watch left half-read (an error, a stop) would otherwise be
            # reused by the next request, which then reads the rest of the stream as its status line.
            stream.close()
            stream.release_conn()

    def _get(self, query: list[tuple[str, str]], timeout: tuple[float, float]) -> Any:
        """The urllib3 response to `list nodes` of this node with `query`, unread; ApiException for an
        answer other than 2xx (its body read up to MAX_ERROR_BODY_BYTES).

        The request is made through the client's own request layer (credentials, TLS, proxy as the
        kubeconfig says), not through CoreV1Api: importing that class costs the start of every
        config-manager about a second (it defines every model of the API), for one URL."""
        request = self._client.param_serialize(
            "GET",
            "/api/v1/nodes",
            query_params=[("fieldSelector", self._selector), *query],
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self._client.call_api(*request, _request_timeout=timeout).response
        if 200 <= response.status <= 299:
            return response
        try:
            body = response.read(MAX_ERROR_BODY_BYTES, decode_content=True)
        finally:
            response.close()
            response.release_conn()
        raise ApiException(status=response.status, reason=response.reason, body=body.decode(errors="replace"))

    def interrupt(self) -> None:
        """End the watch being read (from another thread), and any later one at once: its reader is
        stopping. A watch read otherwise waits up to WATCH_SECONDS for the next event."""
        self._woken.set()
        with self._lock:
            self._interrupted = True
            stream = self._stream
        if stream is not None:
            _shut_down(stream)

    def _events(self, response: Any, version: str) -> Iterator[NodeState]:
        for line in _lines(response, f"the watch of node {self._node_name}"):
            try:
                event = json.loads(line)
                kind = event["type"]
                obj = event["object"]
            except (ValueError, KeyError, TypeError) as exc:
                raise NodeApiError(
                    f"watch of node {self._node_name} sent a malformed event: {line[:200]!r}"
                ) from exc
            if kind == "ERROR":
                code = obj.get("code") if isinstance(obj, dict) else None
                message = obj.get("message", "") if isinstance(obj, dict) else ""
                if code == HTTP_GONE:
                    self._expired = True
                    raise WatchExpired(f"watch from resourceVersion {version}: {message or 'Gone'}")
                raise NodeApiError(f"watch of node {self._node_name} failed: {code} {message}".rstrip())
            what = f"the node in an event of the watch of node {self._node_name}"
            metadata = _mapping(_mapping(obj, what).get("metadata"), f"{what}'s metadata")
            version = str(metadata.get("resourceVersion") or version)
            if kind == "BOOKMARK":
                yield NodeState(None, version)
            elif kind == "DELETED":
                raise NodeApiError(f"node {self._node_name} was deleted")
            else:  # ADDED, MODIFIED
                yield NodeState(_label_of(obj, self._label, what), version)


def _shut_down(stream: Any) -> None:
    """Shut the watch's socket for reading, so a read blocked on it returns at once (urllib3 >= 2.3; with
    an older urllib3, or a stream already closed, the read ends at its next event or timeout)."""
    with contextlib.suppress(AttributeError, ValueError, RuntimeError, OSError):
        stream.shutdown()


def _too_large(what: str) -> NodeApiError:
    return NodeApiError(
        f"{what} sent more than {MAX_EVENT_BYTES // (1024 * 1024)} MiB in one answer (a Node is far "
        "smaller); refused, listing again"
    )


def _read_bounded(response: Any, what: str) -> bytes:
    """The whole body, refused past MAX_EVENT_BYTES."""
    chunks, size = [], 0
    while chunk := response.read(65536):
        size += len(chunk)
        if size > MAX_EVENT_BYTES:
            response.close()
            raise _too_large(what)
        chunks.append(chunk)
    return b"".join(chunks)


def _lines(response: Any, what: str) -> Iterator[bytes]:
    """The stream's newline-separated lines, however the server chunked them, each at most MAX_EVENT_BYTES.

    Each chunk is searched once, and a line is joined once when it ends: linear in what arrives."""
    parts: list[bytes] = []
    size = 0
    # read1, not stream(): stream(n) waits for n bytes, and an event may be the only bytes for minutes.
    while chunk := response.read1(65536):
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            if size + end - start > MAX_EVENT_BYTES:
                raise _too_large(what)
            line = b"".join([*parts, chunk[start:end]])
            parts, size, start = [], 0, end + 1
            if line.strip():
                yield line
        if start < len(chunk):
            size += len(chunk) - start
            if size > MAX_EVENT_BYTES:
                raise _too_large(what)
            parts.append(chunk[start:])
    if (tail := b"".join(parts)).strip():
        yield tail

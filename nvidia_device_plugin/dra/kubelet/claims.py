"""ResourceClaims from the API (resource.k8s.io/v1), and what a prepare reads from one.

Kubelet sends only claim references; the allocation is in the claim's `status.allocation`, read here with
one GET per claim (`get` on `resourceclaims` is the only RBAC this needs). The request is bounded: a
connect and a read timeout, and at most MAX_CLAIM_BYTES of body. `allocated_results` turns the answer
into this driver's allocation results, refusing (ClaimError) a claim that was replaced (another UID under
the same name: the pod's claim was deleted and made anew), one not allocated yet, and one whose opaque
config for this driver is not valid (dra/kubelet/opaque.py reads it; `allocation_of` returns it). A
request's subrequest name (`r/a100`, from `firstAvailable`) is stripped to the request the containers name
(`r`); the full name is kept for matching configs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

import urllib3
from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException

from nvidia_device_plugin.dra.kubelet.model import ClaimError, ClaimRef
from nvidia_device_plugin.dra.kubelet.opaque import OpaqueConfig, opaque_configs

CONNECT_TIMEOUT_S = 5.0
# Kubelet waits 45 s for the whole NodePrepareResources call; a claim read gets well under that.
READ_TIMEOUT_S = 10.0
# A ResourceClaim with 32 requests of 32 devices each is a few tens of KiB; etcd allows 1.5 MiB per object.
MAX_CLAIM_BYTES = 2 * 1024 * 1024


class ClaimNotFound(ClaimError):
    """The API answered 404: no ResourceClaim of that namespace and name exists."""


class ClaimSource(Protocol):
    """Where prepares read claims: the API (ApiClaimSource), or whatever a test puts in its place."""

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        """The ResourceClaim as the API returns it (JSON); ClaimError saying why it cannot be read
        (ClaimNotFound where the API says there is none)."""
        ...


@dataclass(frozen=True)
class AllocationResult:
    """One of this driver's entries in a claim's status.allocation.devices.results."""

    request: str  # the request the containers name (a subrequest's "r/a100" as "r")
    pool: str
    device: str
    subrequest: str = ""  # the request as allocated ("r/a100"), which a config's `requests` may name
    shares: int | None = None  # consumedCapacity["shares"] of a shareable device (KEP-5075), when given


@dataclass(frozen=True)
class Allocation:
    """This driver's part of a claim's status.allocation.devices: its results and its opaque configs."""

    results: tuple[AllocationResult, ...]
    configs: tuple[OpaqueConfig, ...]  # class configs first, then claim configs


class ApiClaimSource:
    """Reads ResourceClaims through a `kubernetes` ApiClient (in-cluster or kubeconfig credentials)."""

    def __init__(
        self,
        api_client: Any,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        # CustomObjectsApi, not ResourceV1Api: the answer is read as JSON anyway, and the typed API's
        # module and models would add a tenth of a second to every DRA-mode start.
        self._api = kube_client.CustomObjectsApi(api_client)
        self._timeouts = (connect_timeout_s, read_timeout_s)

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        what = f"reading ResourceClaim {namespace}/{name} from the API"
        try:
            # The urllib3 response, read here with a bound (the annotation says object).
            response: Any = self._api.get_namespaced_custom_object(
                "resource.k8s.io",
                "v1",
                namespace,
                "resourceclaims",
                name,
                _preload_content=False,
                _request_timeout=self._timeouts,
            )
            try:
                body = response.read(MAX_CLAIM_BYTES + 1)
            finally:
                response.release_conn()
        except ApiException as exc:
            error = ClaimNotFound if exc.status == 404 else ClaimError
            raise error(f"{what} failed: {_describe(exc)}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClaimError(f"{what} failed: {exc}") from None
        if len(body) > MAX_CLAIM_BYTES:
            raise ClaimError(f"{what}: the answer is over {MAX_CLAIM_BYTES // 1024} KiB; refused")
        try:
            document = json.loads(body)
        except ValueError as exc:
            raise ClaimError(f"{what}: the answer is not JSON ({exc})") from None
        if not isinstance(document, dict):
            raise ClaimError(f"{what}: the answer is not an object")
        return document


def _describe(exc: ApiException) -> str:
    try:
        message = json.loads(exc.body or "").get("message", "")
    except (TypeError, ValueError, AttributeError):
        message = ""
    hint = ""
    if exc.status == 404:
        hint = " (the claim was deleted)"
    elif exc.status in (401, 403):
        hint = " (the daemon's ServiceAccount needs `get` on resourceclaims.resource.k8s.io)"
    return f"HTTP {exc.status} {exc.reason}" + (f": {message}" if message else "") + hint


def allocated_results(ref: ClaimRef, claim: dict[str, Any], driver: str) -> tuple[AllocationResult, ...]:
    """This driver's allocation results of `claim`, which kubelet named `ref`; ClaimError when refused."""
    return allocation_of(ref, claim, driver).results


def allocation_of(ref: ClaimRef, claim: dict[str, Any], driver: str) -> Allocation:
    """This driver's results and configs of `claim`, which kubelet named `ref`; ClaimError when refused."""
    uid = _field(claim, "metadata", "uid")
    if uid != ref.uid:
        raise ClaimError(
            f"{ref.label}: the API's claim of that name has UID {uid or '(none)'}: it was replaced "
            "since kubelet saw it; not prepared"
        )
    allocation = _field(claim, "status", "allocation")
    if not isinstance(allocation, dict):
        raise ClaimError(f"{ref.label} is not allocated (status.allocation is empty); not prepared")
    devices = allocation.get("devices") or {}
    if not isinstance(devices, dict):
        raise ClaimError(f"{ref.label}: status.allocation.devices is not an object")
    try:
        configs = opaque_configs(devices.get("config") or [], driver)
    except ClaimError as exc:
        raise ClaimError(f"{ref.label}: {exc}") from None
    results = devices.get("results") or []
    if not isinstance(results, list):
        raise ClaimError(f"{ref.label}: status.allocation.devices.results is not a list")
    ours = []
    for n, result in enumerate(results):
        if not isinstance(result, dict):
            raise ClaimError(f"{ref.label}: status.allocation.devices.results[{n}] is not an object")
        if result.get("driver") != driver:
            continue  # another driver's device in the same claim: its own plugin prepares it
        request, pool, device = (result.get(key) for key in ("request", "pool", "device"))
        if not (isinstance(request, str) and isinstance(pool, str) and isinstance(device, str)):
            raise ClaimError(
                f"{ref.label}: status.allocation.devices.results[{n}] lacks request, pool or device"
            )
        shares = _consumed_shares(result.get("consumedCapacity"), f"{ref.label}: results[{n}]")
        ours.append(AllocationResult(request.split("/", 1)[0], pool, device, request, shares))
    return Allocation(tuple(ours), configs)


def _consumed_shares(consumed: Any, where: str) -> int | None:
    """The `shares` a result consumed (a whole-number quantity, "2"); None where it names none."""
    if consumed is None:
        return None
    if not isinstance(consumed, dict):
        raise ClaimError(f"{where}: consumedCapacity is not an object")
    value = consumed.get("shares")
    if value is None:
        return None
    text = str(value)
    if isinstance(value, bool) or not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ClaimError(f"{where}: consumedCapacity shares {value!r} is not a whole number of shares")
    return int(text)


def _field(document: dict[str, Any], *path: str) -> Any:
    value: Any = document
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value

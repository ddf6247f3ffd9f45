"""The DRAPlugin gRPC service kubelet calls, in every version the plugin advertises, and its limits.

Both versions carry the same messages under different proto packages, which are the service names on the
wire (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`, `...v1beta1.DRAPlugin`): one handler set serves either,
parameterised by the version's generated module. Requests arrive as raw bytes and are parsed and checked
here (plugin/protocol.py's parse): an undecodable request, more than MAX_CLAIMS_PER_CALL claims or a claim
reference lacking a field is refused as a whole with INVALID_ARGUMENT; everything about one claim is
answered in that claim's entry of the response map. A claim UID names files and CDI devices, so it must be
a UID (letters, digits, `-`, `.`, `_`; at most 128 characters).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import grpc
from google.protobuf.message import Message

from nvidia_device_plugin.api.dra.v1 import api_pb2 as v1_pb
from nvidia_device_plugin.api.dra.v1beta1 import api_pb2 as v1beta1_pb
from nvidia_device_plugin.dra.kubelet.model import ClaimOutcome, ClaimRef
from nvidia_device_plugin.plugin.protocol import RequestError, check_count, parse
from nvidia_device_plugin.plugin.server import shorten

log = logging.getLogger(__name__)

# Kubelet sends the claims of one pod for this driver: a pod has at most 32 claims.
MAX_CLAIMS_PER_CALL = 256
MAX_REQUEST_BYTES = 1024 * 1024
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MAX_NAMESPACE = 63
_MAX_NAME = 253


@dataclass(frozen=True)
class ApiVersion:
    """One version of the DRAPlugin service."""

    name: str  # as GetInfo advertises it: "v1.DRAPlugin"
    service: str  # the gRPC service name: "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    messages: ModuleType  # the generated api_pb2 of the version


V1 = ApiVersion("v1.DRAPlugin", "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin", v1_pb)
V1BETA1 = ApiVersion("v1beta1.DRAPlugin", "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin", v1beta1_pb)
# GetInfo's order: kubelet takes the first version it supports (1.34+ v1, 1.32-1.33 v1beta1).
VERSIONS = (V1, V1BETA1)


class ClaimBackend(Protocol):
    """What the service calls (prepare.ClaimPreparer)."""

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, ClaimOutcome]: ...

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str | None]: ...


def claim_refs(request: Any) -> list[ClaimRef]:
    """The claims of a (Un)PrepareResources request, each once; RequestError for a malformed one."""
    check_count("claims", len(request.claims), MAX_CLAIMS_PER_CALL)
    refs: dict[str, ClaimRef] = {}
    for n, claim in enumerate(request.claims):
        where = f"claims[{n}]"
        if not _UID.match(claim.uid):
            raise RequestError(f"{where}.uid {shorten(repr(claim.uid), 200)} is not a UID")
        if not 0 < len(claim.namespace) <= _MAX_NAMESPACE or not 0 < len(claim.name) <= _MAX_NAME:
            raise RequestError(f"{where} (UID {claim.uid}): namespace and name are required")
        refs.setdefault(claim.uid, ClaimRef(claim.namespace, claim.name, claim.uid))
    return list(refs.values())


def prepare_response(messages: ModuleType, outcomes: Mapping[str, ClaimOutcome]) -> Any:
    response = messages.NodePrepareResourcesResponse()
    for uid, outcome in outcomes.items():
        entry = response.claims[uid]
        if outcome.error is not None:
            entry.error = shorten(outcome.error)
            continue
        for device in outcome.devices:
            entry.devices.add(
                request_names=device.requests,
                pool_name=device.pool,
                device_name=device.device,
                cdi_device_ids=device.cdi_ids,
            )
    return response


def unprepare_response(messages: ModuleType, errors: Mapping[str, str | None]) -> Any:
    response = messages.NodeUnprepareResourcesResponse()
    for uid, error in errors.items():
        entry = response.claims[uid]  # an entry for every claim, even without an error
        if error is not None:
            entry.error = shorten(error)
    return response


def dra_handlers(version: ApiVersion, backend: ClaimBackend) -> grpc.GenericRpcHandler[bytes, Message]:
    """The DRAPlugin service of `version`, answered by `backend`."""
    messages = version.messages

    def prepare(raw: bytes, context: grpc.ServicerContext) -> Message:
        def answer() -> Message:
            refs = claim_refs(parse(messages.NodePrepareResourcesRequest, raw))
            return prepare_response(messages, backend.prepare(refs))  # type: ignore[no-any-return]

        return _answer(version, "NodePrepareResources", context, answer)

    def unprepare(raw: bytes, context: grpc.ServicerContext) -> Message:
        def answer() -> Message:
            refs = claim_refs(parse(messages.NodeUnprepareResourcesRequest, raw))
            return unprepare_response(messages, backend.unprepare(refs))  # type: ignore[no-any-return]

        return _answer(version, "NodeUnprepareResources", context, answer)

    return grpc.method_handlers_generic_handler(
        version.service,
        {
            "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
                prepare, response_serializer=_serialize
            ),
            "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
                unprepare, response_serializer=_serialize
            ),
        },
    )


def _answer(
    version: ApiVersion, method: str, context: grpc.ServicerContext, fn: Callable[[], Message]
) -> Message:
    """One call: a malformed request is INVALID_ARGUMENT, a surprise INTERNAL; both logged."""
    try:
        return fn()
    except RequestError as exc:
        message = shorten(str(exc))
        log.warning("%s %s refused: %s", version.name, method, message)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
        raise  # abort() raises; this keeps the type checker sure nothing falls through
    except Exception as exc:
        log.exception("%s %s failed", version.name, method)
        context.abort(grpc.StatusCode.INTERNAL, shorten(f"{method} failed: {exc}"))
        raise


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()

"""Kubelet's plugin registration (pluginregistration/v1), served on `<driver>-reg.sock`.

Kubelet's plugin watcher finds the socket in its plugins_registry directory, asks GetInfo (type DRAPlugin,
the driver name, the endpoint socket, the versions served there, most preferred first), takes the first
version it supports, and reports the outcome through NotifyRegistrationStatus. The plugin is passive: it
never calls kubelet. Deleting the socket deregisters the driver; a new socket registers it again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import grpc
from google.protobuf.message import Message

from nvidia_device_plugin.api.pluginregistration.v1 import api_pb2 as reg_pb
from nvidia_device_plugin.plugin.protocol import RequestError, parse
from nvidia_device_plugin.plugin.server import shorten

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

SERVICE = "pluginregistration.Registration"
PLUGIN_TYPE = "DRAPlugin"
MAX_REQUEST_BYTES = 64 * 1024  # both requests are a few bytes; an error string from kubelet at most a few KiB


def registration_socket_name(driver: str) -> str:
    return f"{driver}-reg.sock"


class RegistrationState:
    """What kubelet last said about the registration: None until it said anything."""

    def __init__(self, driver: str) -> None:
        self._driver = driver
        self._lock = threading.Lock()
        self._registered: bool | None = None
        self._error = ""

    def notified(self, registered: bool, error: str) -> None:
        with self._lock:
            changed = (registered, error) != (self._registered, self._error)
            self._registered, self._error = registered, error
        if not changed:
            return
        if registered:
            log.info("kubelet registered the DRA driver %s", self._driver)
        else:
            log.error("kubelet refused to register the DRA driver %s: %s", self._driver, error or "no reason")

    def forget(self) -> None:
        """The registration socket is served anew: kubelet registers the driver again."""
        with self._lock:
            self._registered, self._error = None, ""

    @property
    def registered(self) -> bool | None:
        with self._lock:
            return self._registered

    def problem(self) -> str | None:
        """Why the driver is not registered, when kubelet said it refused; None otherwise."""
        with self._lock:
            if self._registered is False:
                return (
                    f"kubelet refused to register the DRA driver {self._driver}: {self._error or 'no reason'}"
                )
            return None


def registration_handlers(
    driver: str, endpoint: Path, versions: Sequence[str], state: RegistrationState
) -> grpc.GenericRpcHandler[bytes, Message]:
    """The Registration service: GetInfo answers (DRAPlugin, `driver`, `endpoint`, `versions`)."""
    info = reg_pb.PluginInfo(
        type=PLUGIN_TYPE, name=driver, endpoint=str(endpoint), supported_versions=list(versions)
    )

    def get_info(raw: bytes, context: grpc.ServicerContext) -> reg_pb.PluginInfo:
        _parse_or_abort(reg_pb.InfoRequest, raw, context, "GetInfo")
        log.debug("kubelet asked for the DRA driver's registration info")
        return info

    def notify(raw: bytes, context: grpc.ServicerContext) -> reg_pb.RegistrationStatusResponse:
        status = _parse_or_abort(reg_pb.RegistrationStatus, raw, context, "NotifyRegistrationStatus")
        state.notified(status.plugin_registered, shorten(status.error))
        return reg_pb.RegistrationStatusResponse()

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "GetInfo": grpc.unary_unary_rpc_method_handler(get_info, response_serializer=_serialize),
            "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(
                notify, response_serializer=_serialize
            ),
        },
    )


def _parse_or_abort(message_type: type[M], raw: bytes, context: grpc.ServicerContext, method: str) -> M:
    try:
        return parse(message_type, raw)
    except RequestError as exc:
        log.warning("registration %s refused: %s", method, exc)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        raise


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()

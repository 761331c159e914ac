"""GetInfo and version negotiation: one registration socket's answer, validated.

Counterpart of the plugin watcher's ``GetInfo`` call and ``NotifyRegistrationStatus``
(``pkg/kubelet/pluginmanager/operationexecutor``) and of the DRA handler's
``ValidatePlugin``/``RegisterPlugin`` (``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go``):
which DRA and health services the kubelet would use, and the :class:`PluginInfo` the
watcher hands on.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence

import grpc

from kubelet_dra import errors
from kubelet_dra import settings as settings_mod
from kubelet_dra._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from kubelet_dra._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubelet_dra.plugin.validation import validate_driver_name, validate_endpoint

logger = logging.getLogger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""``servicesSupportedByKubelet`` in ``dra_plugin.go``."""
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
"""``healthServicesSupportedByKubelet``, in the kubelet's order of preference."""
NOTIFY_TIMEOUT = 5.0
"""The kubelet's timeout for ``NotifyRegistrationStatus``."""


@dataclasses.dataclass(frozen=True, slots=True)
class PluginInfo:
    """A validated DRA plugin registration.

    ``socket`` is the registration socket ("" for a statically configured
    driver); ``endpoint`` is the DRA service socket the streams dial.
    """

    driver: str
    endpoint: str
    socket: str
    supported_versions: tuple[str, ...]
    dra_service: str
    health_service: str | None


def pick_health_service(versions: Iterable[str] | None) -> str | None:
    """The health service to stream from: v1 over v1alpha1, ``None`` if neither."""
    offered = set(versions or ())
    return next((s for s in HEALTH_SERVICES if s in offered), None)


def validate_supported_services(versions: Sequence[str]) -> str:
    """The DRA service the kubelet would use: the plugin's first supported entry.

    Mirrors ``validateSupportedServices``: the plugin's order decides, health
    strings never make validation fail.
    """
    if not versions:
        raise errors.RegistrationError(
            "empty list of supported gRPC services (aka supported versions)",
            reason="supported_versions",
        )
    for service in versions:
        if service in DRA_SERVICES:
            return service
    raise errors.RegistrationError(
        f"none of the supported gRPC services {list(versions)} is one of {list(DRA_SERVICES)}",
        reason="supported_versions",
    )


def make_plugin_info(
    driver: str, endpoint: str, versions: Sequence[str], *, socket: str = ""
) -> PluginInfo:
    """Validate a registration (from GetInfo or static configuration).

    In the kubelet's order: name, endpoint (an empty one means the
    registration socket, as the plugin watcher fills it in), services.
    """
    validate_driver_name(driver)
    endpoint = endpoint or socket
    validate_endpoint(endpoint)
    dra_service = validate_supported_services(versions)
    return PluginInfo(
        driver=driver,
        endpoint=endpoint,
        socket=socket,
        supported_versions=tuple(versions),
        dra_service=dra_service,
        health_service=pick_health_service(versions),
    )


def plugin_info_from_proto(info: reg_pb2.PluginInfo, socket: str) -> PluginInfo:
    """Validate a ``GetInfo`` answer; an empty endpoint means the socket itself."""
    if info.type != DRA_PLUGIN_TYPE:
        raise errors.RegistrationError(
            f"plugin type {info.type!r} is not {DRA_PLUGIN_TYPE!r}", reason="plugin_type"
        )
    return make_plugin_info(info.name, info.endpoint, list(info.supported_versions), socket=socket)


class Retryable(errors.RegistrationError):
    """A failure a later attempt can cure (no server yet, timeout, transient error).

    ``kind`` (the gRPC code) keys the log-once set, since details vary per attempt.
    """

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


async def fetch_plugin_info(socket: str, *, role: settings_mod.Role, timeout: float) -> PluginInfo:
    """Register one socket: GetInfo, validate, and (as owner) notify the plugin."""
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        try:
            answer = await stub.GetInfo(reg_pb2.InfoRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            raise Retryable(f"GetInfo failed: {code}: {exc.details()}", kind=code) from exc
        try:
            info = plugin_info_from_proto(answer, socket)
        except errors.RegistrationError as exc:
            if role is settings_mod.Role.OWNER:
                await notify(stub, registered=False, error=str(exc))
            raise
        if role is settings_mod.Role.OWNER:
            await notify(stub, registered=True, error="")
        return info


async def notify(stub: reg_grpc.RegistrationStub, *, registered: bool, error: str) -> None:
    status = reg_pb2.RegistrationStatus(plugin_registered=registered, error=error)
    try:
        await stub.NotifyRegistrationStatus(status, timeout=NOTIFY_TIMEOUT)
    except grpc.aio.AioRpcError as exc:
        # The kubelet keeps a plugin registered even when this call fails.
        logger.warning("NotifyRegistrationStatus failed: %s", exc.code().name)

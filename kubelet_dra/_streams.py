"""One endpoint's health stream: open, convert, reconnect.

Counterpart of the stream loop in the kubelet's
``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go`` (``add()``'s
``wait.UntilWithContext``), of ``DRAPlugin.NodeWatchResources`` in
``dra_plugin.go`` and of ``buildDeviceHealth`` in ``manager.go``. It is used by
:mod:`kubelet_dra.plugins`, which owns the tasks and the health cache.

Where the kubelet retries every 5 s forever, even on ``UNIMPLEMENTED``
(issue #141855), this loop stops on ``UNIMPLEMENTED`` and otherwise backs off
exponentially with jitter, up to a cap, resetting after a healthy period.
Protobuf messages stop here: v1 and v1alpha1 responses both become
``models.DeviceReport`` values.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
import logging
import random
from collections.abc import Iterable
from typing import Any, Protocol

import grpc

from kubelet_dra import clock as clock_mod
from kubelet_dra import healthinfo, models, registration
from kubelet_dra import settings as settings_mod
from kubelet_dra._proto.dra_health.v1 import api_pb2 as v1_pb2
from kubelet_dra._proto.dra_health.v1 import api_pb2_grpc as v1_grpc
from kubelet_dra._proto.dra_health.v1alpha1 import api_pb2 as v1alpha1_pb2
from kubelet_dra._proto.dra_health.v1alpha1 import api_pb2_grpc as v1alpha1_grpc

logger = logging.getLogger(__name__)

_CLIENTS: dict[str, tuple[Any, Any]] = {
    "v1.DRAResourceHealth": (v1_grpc.DRAResourceHealthStub, v1_pb2.NodeWatchResourcesRequest),
    "v1alpha1.DRAResourceHealth": (
        v1alpha1_grpc.DRAResourceHealthStub,
        v1alpha1_pb2.NodeWatchResourcesRequest,
    ),
}
# Wire enum numbers are identical in v1alpha1 and v1.
_HEALTH = {1: models.HealthStatus.HEALTHY, 2: models.HealthStatus.UNHEALTHY}
MAX_NAME_BYTES = 1024
"""Pool and device names are short Kubernetes names; anything longer is refused."""
_SAFE_NAME_CHARS = MAX_NAME_BYTES // 4
_SAFE_MESSAGE_CHARS = healthinfo.MESSAGE_MAX_BYTES // 4


class StreamState(enum.StrEnum):
    CONNECTING = "connecting"
    STREAMING = "streaming"
    BACKOFF = "backoff"
    UNIMPLEMENTED = "unimplemented"
    STOPPED = "stopped"


class Outcome(enum.Enum):
    EOF = "eof"
    ERROR = "error"
    UNIMPLEMENTED = "unimplemented"


@dataclasses.dataclass
class EndpointStatus:
    """Plain state of one endpoint's stream, read by the metrics module at scrape time."""

    driver: str
    endpoint: str
    service: str
    state: StreamState = StreamState.CONNECTING
    reconnects: int = 0
    reports: int = 0
    last_report: float | None = None
    last_error: str = ""
    logged: set[str] = dataclasses.field(default_factory=set, repr=False)

    def log_once(self, reason: str, message: str, *args: object) -> None:
        """Log a problem once per reason for this endpoint, not once per message."""
        if reason not in self.logged:
            self.logged.add(reason)
            logger.warning(message, *args)


@dataclasses.dataclass
class Converted:
    """One response, converted: the reports to apply and what was refused or altered."""

    reports: list[models.DeviceReport]
    problems: collections.Counter[str]
    refused: str | None = None  # set when the whole report is refused


def convert(devices: Iterable[Any], *, max_devices: int) -> Converted:
    """Turn the repeated ``DeviceHealth`` of a v1 or v1alpha1 response into reports.

    Empty or oversized names are refused; within one report the last entry
    for a device wins; unknown enum numbers read as ``Unknown``; messages are
    truncated to the API limit.
    """
    problems: collections.Counter[str] = collections.Counter()
    devices = list(devices)
    if len(devices) > max_devices:
        problems["too_many_devices"] += 1
        return Converted([], problems, refused="too_many_devices")
    by_key: dict[tuple[str, str], models.DeviceReport] = {}
    for device in devices:
        report = _convert_one(device, problems)
        if report is None:
            continue
        key = (report.pool, report.device)
        if key in by_key:
            problems["duplicate"] += 1
            del by_key[key]  # keep the report order of the winning entry
        by_key[key] = report
    return Converted(list(by_key.values()), problems)


def _convert_one(device: Any, problems: collections.Counter[str]) -> models.DeviceReport | None:
    # The hot path (every device of every report): cheap checks first, the
    # byte-length checks only when a name or message could be over the limit
    # (a UTF-8 character is at most 4 bytes).
    ident = device.device
    pool, name = ident.pool_name, ident.device_name
    if not pool or not name:
        problems["empty_name"] += 1
        return None
    if (len(pool) > _SAFE_NAME_CHARS or len(name) > _SAFE_NAME_CHARS) and (
        len(pool.encode()) > MAX_NAME_BYTES or len(name.encode()) > MAX_NAME_BYTES
    ):
        problems["name_too_long"] += 1
        return None
    health = device.health
    status = _HEALTH.get(health)
    if status is None:
        status = models.HealthStatus.UNKNOWN
        if health != 0:
            problems["unknown_health"] += 1
    timeout = device.health_check_timeout_seconds
    if timeout < 0:
        problems["negative_timeout"] += 1
    message = device.message
    if len(message) > _SAFE_MESSAGE_CHARS:
        truncated = healthinfo.truncate_message(message)
        if truncated != message:
            problems["message_truncated"] += 1
            message = truncated
    return models.DeviceReport(pool, name, status, message, timeout, device.last_updated_time)


class Backoff:
    """Exponential backoff with jitter and a cap (the kubelet uses a fixed 5 s)."""

    def __init__(
        self, *, initial: float, cap: float, rng: random.Random, jitter: float = 0.2
    ) -> None:
        self.initial, self.cap, self.jitter = initial, cap, jitter
        self._rng = rng
        self._attempt = 0

    def reset(self) -> None:
        self._attempt = 0

    def next(self) -> float:
        base = min(self.initial * 2.0**self._attempt, self.cap)
        self._attempt += 1
        return min(base * (1 + self.jitter * self._rng.uniform(-1.0, 1.0)), self.cap)


class Hooks(Protocol):
    """What the stream loop hands its owner (``plugins.PluginManager``)."""

    async def on_report(self, status: EndpointStatus, converted: Converted) -> None: ...

    async def on_end(self, status: EndpointStatus) -> None: ...


async def run_endpoint(
    plugin: registration.PluginInfo,
    status: EndpointStatus,
    *,
    settings: settings_mod.Settings,
    clock: clock_mod.Clock,
    rng: random.Random,
    hooks: Hooks,
) -> None:
    """Stream from one endpoint until cancelled or the service is UNIMPLEMENTED."""
    backoff = Backoff(
        initial=settings.stream_backoff_initial, cap=settings.stream_backoff_max, rng=rng
    )
    while True:
        status.state = StreamState.CONNECTING
        outcome, healthy_for = await _stream_once(
            plugin, status, settings=settings, clock=clock, hooks=hooks
        )
        await hooks.on_end(status)
        if outcome is Outcome.UNIMPLEMENTED:
            status.state = StreamState.UNIMPLEMENTED
            logger.info(
                "driver %s does not implement %s at %s; not retrying until it re-registers",
                plugin.driver,
                plugin.health_service,
                plugin.endpoint,
            )
            return
        if healthy_for >= settings.stream_backoff_reset_after:
            backoff.reset()
        status.state = StreamState.BACKOFF
        await clock.sleep(backoff.next())
        status.reconnects += 1


async def _stream_once(
    plugin: registration.PluginInfo,
    status: EndpointStatus,
    *,
    settings: settings_mod.Settings,
    clock: clock_mod.Clock,
    hooks: Hooks,
) -> tuple[Outcome, float]:
    """One stream; returns how it ended and how long it delivered reports."""
    assert plugin.health_service is not None
    stub_cls, request_cls = _CLIENTS[plugin.health_service]
    options = [("grpc.max_receive_message_length", settings.max_message_bytes)]
    first: float | None = None
    async with grpc.aio.insecure_channel(f"unix:{plugin.endpoint}", options=options) as channel:
        call = stub_cls(channel).NodeWatchResources(request_cls())
        try:
            async for response in call:
                if first is None:
                    first = clock.now()
                    status.state = StreamState.STREAMING
                converted = convert(response.devices, max_devices=settings.max_devices_per_report)
                await hooks.on_report(status, converted)
                # A flooding driver must not starve the other streams and the writer.
                await asyncio.sleep(0)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                # A message over max_message_bytes ends the stream on our side.
                too_large = collections.Counter({"too_large": 1})
                await hooks.on_report(status, Converted([], too_large, refused="too_large"))
            return _classify(exc, status), _since(first, clock)
    status.log_once("eof", "health stream of driver %s at %s ended", plugin.driver, plugin.endpoint)
    return Outcome.EOF, _since(first, clock)


def _classify(exc: grpc.aio.AioRpcError, status: EndpointStatus) -> Outcome:
    code = exc.code()
    status.last_error = f"{code.name}: {exc.details()}"
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return Outcome.UNIMPLEMENTED
    status.log_once(
        code.name,
        "health stream of driver %s at %s failed: %s",
        status.driver,
        status.endpoint,
        status.last_error,
    )
    return Outcome.ERROR


def _since(first: float | None, clock: clock_mod.Clock) -> float:
    return 0.0 if first is None else clock.now() - first

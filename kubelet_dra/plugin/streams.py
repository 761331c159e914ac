"""One endpoint's health stream as an async generator of events: open, convert, reconnect.

Counterpart of the stream loop in the kubelet's ``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go``
(``add()``'s ``wait.UntilWithContext``), of ``DRAPlugin.NodeWatchResources`` in
``dra_plugin.go`` and of ``buildDeviceHealth`` in ``manager.go``. :func:`watch` is the
whole state machine of one endpoint's stream (its docstring has it); :class:`Backoff` is
its reconnect policy. :data:`HEALTH_CLIENTS` is the one table of health-service stubs
(``commands.watch`` uses it too).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import enum
import logging
import random
from collections.abc import AsyncGenerator, Iterable, Sized
from typing import Any

import grpc

from kubelet_dra import clock as clock_mod
from kubelet_dra import models
from kubelet_dra import settings as settings_mod
from kubelet_dra._proto.dra_health.v1 import api_pb2 as v1_pb2
from kubelet_dra._proto.dra_health.v1 import api_pb2_grpc as v1_grpc
from kubelet_dra._proto.dra_health.v1alpha1 import api_pb2 as v1alpha1_pb2
from kubelet_dra._proto.dra_health.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from kubelet_dra.plugin import getinfo
from kubelet_dra.state import healthinfo

logger = logging.getLogger(__name__)

HEALTH_CLIENTS: dict[str, tuple[Any, Any]] = {
    "v1.DRAResourceHealth": (v1_grpc.DRAResourceHealthStub, v1_pb2.NodeWatchResourcesRequest),
    "v1alpha1.DRAResourceHealth": (
        v1alpha1_grpc.DRAResourceHealthStub,
        v1alpha1_pb2.NodeWatchResourcesRequest,
    ),
}
"""Negotiated health service name -> (stub class, ``NodeWatchResources`` request class)."""
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
    """How a stream ended."""

    EOF = "eof"
    ERROR = "error"
    UNIMPLEMENTED = "unimplemented"
    CRASHED = "crashed"  # a bug in this module; logged, then retried like an error
    STOPPED = "stopped"  # the endpoint was removed (deregistration, shutdown)


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

    def log_once(self, reason: str, message: str, *args: object, exc_info: bool = False) -> None:
        """Log a problem once per reason for this endpoint, not once per message."""
        if reason not in self.logged:
            self.logged.add(reason)
            logger.warning(message, *args, exc_info=exc_info)


@dataclasses.dataclass
class Converted:
    """One response, converted: the entries to apply and what was refused or altered.

    ``entries`` is the report keyed as the health cache keys a driver's
    records, each device once (the last entry wins), in report order: the
    cache applies it without building anything per device first.
    """

    entries: dict[healthinfo.Key, healthinfo.Entry]
    problems: collections.Counter[str]
    refused: str | None = None  # set when the whole report is refused

    @property
    def reports(self) -> list[models.DeviceReport]:
        """The entries as :class:`models.DeviceReport` values (for readers, not the hot path)."""
        return [
            models.DeviceReport(pool, device, health, message, timeout, driver_time)
            for (pool, device), (health, message, timeout, driver_time) in self.entries.items()
        ]


def convert(devices: Iterable[Any], *, max_devices: int) -> Converted:
    """Turn the repeated ``DeviceHealth`` of a v1 or v1alpha1 response into entries.

    Empty or oversized names are refused; within one report the last entry
    for a device wins; unknown enum numbers read as ``Unknown``; messages are
    truncated to the API limit.
    """
    problems: collections.Counter[str] = collections.Counter()
    if not isinstance(devices, Sized):
        devices = list(devices)
    if len(devices) > max_devices:
        problems["too_many_devices"] += 1
        return Converted({}, problems, refused="too_many_devices")
    # The hot path (every device of every report, profiled at scale): one loop, no
    # call per device, cheap checks first; the byte-length checks only when
    # a name or message could be over the limit (a UTF-8 character is at
    # most 4 bytes); each entry a plain tuple keyed as the cache keys it.
    entries: dict[healthinfo.Key, healthinfo.Entry] = {}
    health_of, unknown = _HEALTH.get, models.HealthStatus.UNKNOWN
    for device in devices:
        ident = device.device
        pool, name = ident.pool_name, ident.device_name
        if not pool or not name:
            problems["empty_name"] += 1
            continue
        if (len(pool) > _SAFE_NAME_CHARS or len(name) > _SAFE_NAME_CHARS) and (
            len(pool.encode()) > MAX_NAME_BYTES or len(name.encode()) > MAX_NAME_BYTES
        ):
            problems["name_too_long"] += 1
            continue
        health = device.health
        status = health_of(health)
        if status is None:
            status = unknown
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
        key = (pool, name)
        if key in entries:
            problems["duplicate"] += 1
            del entries[key]  # keep the report order of the winning entry
        entries[key] = (status, message, timeout, device.last_updated_time)
    return Converted(entries, problems)


class Backoff:
    """Exponential backoff with jitter and a cap (the kubelet uses a fixed 5 s)."""

    def __init__(
        self, *, initial: float, cap: float, rng: random.Random, jitter: float = 0.2
    ) -> None:
        self.initial, self.cap, self.jitter = initial, cap, jitter
        self._rng = rng
        self._attempt = 0

    def reset(self) -> None:
        """Start again from ``initial`` (after a healthy period)."""
        self._attempt = 0

    def next(self) -> float:
        """The next delay: doubled each time up to ``cap``, with jitter."""
        base = min(self.initial * 2.0**self._attempt, self.cap)
        self._attempt += 1
        return min(base * (1 + self.jitter * self._rng.uniform(-1.0, 1.0)), self.cap)


@dataclasses.dataclass(frozen=True)
class Report:
    """A stream event: one response, converted; apply it unless ``converted.refused``."""

    converted: Converted


@dataclasses.dataclass(frozen=True)
class Ended:
    """A stream event: the stream is over; its devices keep their leases."""

    outcome: Outcome


StreamEvent = Report | Ended


def open_watch(channel: grpc.aio.Channel, service: str) -> Any:
    """Call ``NodeWatchResources`` of a negotiated health ``service`` on ``channel``."""
    stub_cls, request_cls = HEALTH_CLIENTS[service]
    return stub_cls(channel).NodeWatchResources(request_cls())


async def watch(
    plugin: getinfo.PluginInfo,
    status: EndpointStatus,
    *,
    settings: settings_mod.Settings,
    clock: clock_mod.Clock,
    rng: random.Random,
) -> AsyncGenerator[StreamEvent, None]:
    """Events of one endpoint's stream, reconnecting, until closed or ``UNIMPLEMENTED``.

    ``status`` is updated as the stream goes (state, reconnects, last error);
    closing the generator (or cancelling its consumer) sets ``STOPPED``.

    :func:`watch` is the whole state machine of one endpoint's stream: it is the
    only code that sets :class:`StreamState`, and it tells its consumer
    (:class:`kubelet_dra.plugin.plugins.PluginManager`, which owns the task and the
    health cache) what happened as values, never by calling it back:

    - :class:`Report`: one response, converted (or refused as a whole);
    - :class:`Ended`: the stream is over (EOF, an error, ``UNIMPLEMENTED``, or a
      bug in this module); the consumer's devices of the endpoint keep their
      state until their leases run out (``healthinfo.HealthCache.end_endpoint``).

    Where the kubelet retries every 5 s forever, even on ``UNIMPLEMENTED``
    (kubernetes/kubernetes#141855), the generator returns on ``UNIMPLEMENTED`` and otherwise
    backs off exponentially with jitter, up to a cap, resetting after a healthy
    period. Protobuf messages stop here: v1 and v1alpha1 responses both become
    ``healthinfo.Entries``, keyed as the cache keys them (``Converted.reports``
    gives ``models.DeviceReport`` values to readers).
    """
    backoff = Backoff(
        initial=settings.stream_backoff_initial, cap=settings.stream_backoff_max, rng=rng
    )
    try:
        while True:
            status.state = StreamState.CONNECTING
            run = _Run(clock)
            try:
                reports = _reports(plugin, status, settings, run)
                async with contextlib.aclosing(reports):
                    async for converted in reports:
                        yield Report(converted)
            except Exception:
                logger.exception("health stream of driver %s crashed; restarting", plugin.driver)
                run.outcome = Outcome.CRASHED
            # The state moves before the end is yielded: whoever applies the end (the
            # plugin manager, which wakes its start-up wait on every event) reads the
            # stream as no longer connecting.
            ended = run.outcome is Outcome.UNIMPLEMENTED
            status.state = StreamState.UNIMPLEMENTED if ended else StreamState.BACKOFF
            yield Ended(run.outcome)
            if ended:
                logger.info(
                    "driver %s does not implement %s at %s; not retrying until it re-registers",
                    plugin.driver,
                    plugin.health_service,
                    plugin.endpoint,
                )
                return
            await clock.sleep(_delay(run, backoff, settings))
            status.reconnects += 1
    except (GeneratorExit, asyncio.CancelledError):
        status.state = StreamState.STOPPED
        raise


class _Run:
    """One stream attempt: how it ended and when it first delivered a report."""

    def __init__(self, clock: clock_mod.Clock) -> None:
        self.clock = clock
        self.outcome = Outcome.EOF
        self.first: float | None = None

    def healthy_for(self) -> float:
        return 0.0 if self.first is None else self.clock.now() - self.first


def _delay(run: _Run, backoff: Backoff, settings: settings_mod.Settings) -> float:
    if run.outcome is Outcome.CRASHED:
        return settings.stream_backoff_max  # a bug: do not spin on it
    if run.healthy_for() >= settings.stream_backoff_reset_after:
        backoff.reset()
    return backoff.next()


async def _reports(
    plugin: getinfo.PluginInfo,
    status: EndpointStatus,
    settings: settings_mod.Settings,
    run: _Run,
) -> AsyncGenerator[Converted, None]:
    """The converted responses of one stream; sets ``run.outcome`` when it ends."""
    assert plugin.health_service is not None
    options = [("grpc.max_receive_message_length", settings.max_message_bytes)]
    async with grpc.aio.insecure_channel(f"unix:{plugin.endpoint}", options=options) as channel:
        try:
            async for response in open_watch(channel, plugin.health_service):
                if run.first is None:
                    run.first = run.clock.now()
                    status.state = StreamState.STREAMING
                yield convert(response.devices, max_devices=settings.max_devices_per_report)
                # A flooding driver must not starve the other streams and the writer.
                await asyncio.sleep(0)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                # A message over max_message_bytes ends the stream on our side.
                yield Converted({}, collections.Counter({"too_large": 1}), refused="too_large")
            run.outcome = _classify(exc, status)
            return
    status.log_once("eof", "health stream of driver %s at %s ended", plugin.driver, plugin.endpoint)
    run.outcome = Outcome.EOF


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

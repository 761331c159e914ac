"""Registered DRA plugins and their health streams; the lease deadline timer.

Counterpart of the kubelet's ``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go`` (plugin
list per driver, one health stream per endpoint) together with
``HandleWatchResourcesStream`` in ``pkg/kubelet/cm/dra/manager.go``. :class:`PluginManager`
runs one task per endpoint that advertises a health service and applies what its stream
says in one place; it differs from the kubelet where the kubelet has known bugs (#140818,
#140819, #141855), and its docstring says where.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable

from kubelet_dra import clock as clock_mod
from kubelet_dra import models
from kubelet_dra import settings as settings_mod
from kubelet_dra.plugin import getinfo, registration, streams
from kubelet_dra.state import healthinfo

logger = logging.getLogger(__name__)

StreamState = streams.StreamState
EndpointStatus = streams.EndpointStatus
OnChange = Callable[[list[models.DeviceKey]], Awaitable[None]]
_EPSILON = 0.001  # leases expire strictly after their deadline
STOP_TIMEOUT = 3.0
"""Seconds to wait for a cancelled stream task before giving up on it."""
MAX_ENDPOINTS_PER_DRIVER = 64
"""Health streams per driver; over it the oldest endpoint's stream stops.

The kubelet streams from every registered endpoint (``add`` in
``dra_plugin_manager.go`` has no bound, on every line from 1.34 to 1.38), and so
do we up to this many. A rolling upgrade needs two, and a kubelet restart
re-registers every running driver pod at once, so 64 is far above a real node.
It bounds what a driver that keeps serving stale registration sockets (old
pods that never exit, a bug) costs: one task and one gRPC channel per stream.
The root-owned registry makes that a driver bug, not an attack. Over the bound
the *oldest* stream stops, never the newest: the newest endpoint is the one the
kubelet prefers and the one an upgrade moves to."""


@dataclasses.dataclass
class DriverStats:
    """Per-driver counters, read by the metrics module."""

    reports: int = 0
    device_updates: int = 0
    last_report: float | None = None


@dataclasses.dataclass
class _Endpoint:
    plugin: getinfo.PluginInfo
    status: EndpointStatus | None = None  # None: no health service advertised
    task: asyncio.Task[None] | None = None
    stopped: bool = False  # the stream was stopped and its devices ended

    @property
    def streaming(self) -> bool:
        return self.task is not None and not self.task.done() and not self.stopped


class PluginManager:
    """Health streams of every registered DRA plugin, feeding one health cache.

    Use as ``async with PluginManager(...) as manager`` or call :meth:`start`
    and :meth:`close`; pass :meth:`handle` as the ``on_event`` callback of a
    ``registration.RegistryWatcher``.

    :class:`PluginManager` receives ``registration.PluginEvent`` values through
    :meth:`PluginManager.handle` and runs one task per endpoint that
    advertises a health service. That task consumes the events of
    ``streams.watch`` (the stream's state machine) and applies each in one
    place, :meth:`PluginManager._apply`: a report goes into the
    ``healthinfo.HealthCache``, the end of a stream only tells the cache that the
    endpoint no longer streams; the devices whose visible state changed go to
    ``on_change``. Differences from the kubelet, each tested:

    - the lease outlives the stream: a stream that ends (EOF, error,
      ``UNIMPLEMENTED``, deregistration) changes nothing; its devices keep their
      last state until their lease runs out, then the deadline task turns them
      ``Unknown`` (and ``on_change`` hears of it then), unless an endpoint of the
      driver (the restarted driver, the new pod of a rolling upgrade) reported
      them first. The kubelet clears the whole driver at once and notifies nobody
      (#140818), so a driver restart flashes ``Unknown`` there;
    - ``UNIMPLEMENTED`` stops the endpoint's task until it re-registers (#141855);
    - a deadline task wakes at the earliest lease deadline and expires leases
      then, so pods see ``Unknown`` on time (#140819);
    - more than :data:`MAX_ENDPOINTS_PER_DRIVER` streaming endpoints of one
      driver stop the *oldest* one's stream (the kubelet has no bound; no real
      node comes near it).

    Observability is plain state (``endpoints``, ``drivers``, ``refused``,
    ``lease_expiries``) that the metrics module reads at scrape time.
    """

    def __init__(
        self,
        cache: healthinfo.HealthCache,
        *,
        settings: settings_mod.Settings,
        clock: clock_mod.Clock,
        on_change: OnChange,
        rng: random.Random | None = None,
    ) -> None:
        self.cache = cache
        self._settings = settings
        self._clock = clock
        self._on_change = on_change
        self._rng = rng or random.Random()
        self._endpoints: dict[str, _Endpoint] = {}
        self._deadline_task: asyncio.Task[None] | None = None
        self._wake = clock_mod.Alarm(clock)
        self._progress = clock_mod.Alarm(clock)  # set by every applied stream event
        self._sleeping_until: float | None = None
        self.drivers: dict[str, DriverStats] = collections.defaultdict(DriverStats)
        self.refused: collections.Counter[tuple[str, str]] = collections.Counter()
        """(driver, reason) -> devices or reports refused or altered; reasons are
        ``empty_name``, ``name_too_long``, ``duplicate``, ``unknown_health``,
        ``negative_timeout``, ``message_truncated`` (per device) and
        ``too_many_devices``, ``too_large`` (per report), ``too_many_endpoints``
        (per stream stopped because a driver had more than
        :data:`MAX_ENDPOINTS_PER_DRIVER` streaming endpoints)."""
        self.lease_expiries = 0
        """Devices turned ``Unknown`` by the deadline task."""

    # -- lifecycle ---------------------------------------------------------

    async def __aenter__(self) -> PluginManager:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the lease-deadline task; streams start as plugins register."""
        if self._deadline_task is None:
            self._deadline_task = asyncio.create_task(self._deadline_loop(), name="lease-deadlines")

    async def close(self) -> None:
        """Stop every stream (their devices keep their leases) and the deadline task.

        Safe to cancel (an owner's shutdown timeout): every task is cancelled all the
        same, so none outlives its event loop half-run.
        """
        try:
            for endpoint in list(self._endpoints):
                await self._remove(endpoint)
        finally:
            for entry in self._endpoints.values():
                if entry.task is not None:
                    entry.task.cancel()
            deadline_task, self._deadline_task = self._deadline_task, None
            await clock_mod.cancel_and_wait(deadline_task)

    # -- registration events ----------------------------------------------

    async def handle(self, event: registration.PluginEvent) -> None:
        """Apply a register or deregister event from the registry watcher."""
        plugin = event.plugin
        if event.kind is registration.EventKind.DEREGISTER:
            current = self._endpoints.get(plugin.endpoint)
            if current is not None and current.plugin == plugin:
                await self._remove(plugin.endpoint)
            return
        if plugin.endpoint in self._endpoints:
            # The kubelet refuses a second registration of the same endpoint.
            logger.error(
                "driver %s: endpoint %s is already registered; ignoring %s",
                plugin.driver,
                plugin.endpoint,
                plugin.socket or "static registration",
            )
            return
        self._add(plugin)
        await self._bound_streams(plugin.driver)

    @property
    def endpoints(self) -> dict[str, EndpointStatus]:
        """Endpoint path -> stream status, for endpoints with a health service."""
        return {p: e.status for p, e in self._endpoints.items() if e.status is not None}

    def primed(self) -> bool:
        """Every health stream delivered a report, or ended (backoff, unimplemented, stopped)."""
        waiting = (StreamState.CONNECTING, StreamState.STREAMING)
        return all(
            entry.status.reports > 0 or entry.status.state not in waiting
            for entry in self._endpoints.values()
            if entry.status is not None
        )

    async def wait_primed(self, timeout: float) -> bool:
        """Wait until :meth:`primed` or ``timeout`` seconds of the clock; say which.

        Woken by each stream event applied (a report, an end, a stop), so a start-up
        wait costs nothing while the streams are quiet and ends as the last one reports.
        """
        deadline = self._clock.now() + timeout
        while not self.primed():
            left = deadline - self._clock.now()
            if left <= 0:
                return False
            self._progress.clear()
            await self._progress.sleep(left)
        return True

    @property
    def plugins(self) -> list[getinfo.PluginInfo]:
        """Every registered plugin, with or without a health service."""
        return [e.plugin for e in self._endpoints.values()]

    def _add(self, plugin: getinfo.PluginInfo) -> None:
        entry = _Endpoint(plugin)
        self._endpoints[plugin.endpoint] = entry
        if plugin.health_service is None:
            logger.info("driver %s advertises no health service; not streaming", plugin.driver)
            return
        entry.status = EndpointStatus(plugin.driver, plugin.endpoint, plugin.health_service)
        entry.task = asyncio.create_task(
            self._consume(plugin, entry.status), name=f"health {plugin.endpoint}"
        )

    async def _bound_streams(self, driver: str) -> None:
        """Stop the oldest streams of ``driver`` beyond :data:`MAX_ENDPOINTS_PER_DRIVER`.

        The endpoint stays registered (its deregistration is still expected, and a
        second registration of it is still refused); its devices end as at a
        deregistration. Endpoints are kept in registration order, oldest first.
        """
        streaming = [
            e for e in self._endpoints.values() if e.plugin.driver == driver and e.streaming
        ]
        for entry in streaming[: max(0, len(streaming) - MAX_ENDPOINTS_PER_DRIVER)]:
            self.refused[driver, "too_many_endpoints"] += 1
            logger.error(
                "driver %s has more than %d endpoints with a health stream; stopping the "
                "stream of the oldest, %s (counted in refused as too_many_endpoints)",
                driver,
                MAX_ENDPOINTS_PER_DRIVER,
                entry.plugin.endpoint,
            )
            await self._stop_stream(entry)

    async def _remove(self, endpoint: str) -> None:
        await self._stop_stream(self._endpoints.pop(endpoint))

    async def _stop_stream(self, entry: _Endpoint) -> None:
        """Cancel the endpoint's stream and end its devices (once)."""
        if entry.stopped:
            return
        entry.stopped = True
        endpoint = entry.plugin.endpoint
        if entry.task is not None:
            entry.task.cancel()
            # Bounded: a stream stuck in gRPC's channel teardown must not hold
            # up deregistration or the sidecar's exit.
            _, stuck = await asyncio.wait({entry.task}, timeout=STOP_TIMEOUT)
            if stuck:
                logger.warning(
                    "health stream of driver %s at %s did not stop within %s s; leaving it",
                    entry.plugin.driver, endpoint, STOP_TIMEOUT,
                )  # fmt: skip
        if entry.status is not None:
            # Set here too: a task cancelled before it ever ran never set it.
            entry.status.state = StreamState.STOPPED
            await self._apply(entry.status, streams.Ended(streams.Outcome.STOPPED))

    async def _consume(self, plugin: getinfo.PluginInfo, status: EndpointStatus) -> None:
        """The endpoint's task: apply every event of its stream until the stream returns."""
        events = streams.watch(
            plugin, status, settings=self._settings, clock=self._clock, rng=self._rng
        )
        async with contextlib.aclosing(events):
            async for event in events:
                await self._apply(status, event)

    # -- stream events -----------------------------------------------------

    async def _apply(self, status: EndpointStatus, event: streams.StreamEvent) -> None:
        """The one place where a stream event changes the cache and notifies ``on_change``."""
        try:
            if isinstance(event, streams.Report):
                changed = self._record(status, event.converted)
            else:
                changed = self.cache.end_endpoint(status.driver, status.endpoint, self._clock.now())
        except Exception:
            # A bug here must not end the stream; the traceback once per endpoint.
            status.log_once(
                "apply_failed",
                "driver %s at %s: applying a stream event failed",
                status.driver,
                status.endpoint,
                exc_info=True,
            )
            return
        finally:
            self._progress.set()
        await self._notify(changed)

    def _record(
        self, status: EndpointStatus, converted: streams.Converted
    ) -> list[models.DeviceKey]:
        self._count_problems(status, converted)
        if converted.refused is not None:
            return []
        now = self._clock.now()
        changed = self.cache.update_entries(
            status.driver, converted.entries, now=now, endpoint=status.endpoint
        )
        status.reports += 1
        status.last_report = now
        stats = self.drivers[status.driver]
        stats.reports += 1
        stats.device_updates += len(converted.entries)
        stats.last_report = now
        self._poke_deadline()
        return changed

    def _count_problems(self, status: EndpointStatus, converted: streams.Converted) -> None:
        for reason, count in converted.problems.items():
            self.refused[status.driver, reason] += count
            status.log_once(
                reason,
                "driver %s at %s sent a bad health report (%s); counted in refused, "
                "logged once per endpoint",
                status.driver,
                status.endpoint,
                reason,
            )

    async def _notify(self, changed: list[models.DeviceKey]) -> None:
        if not changed:
            return
        try:
            await self._on_change(changed)
        except Exception:
            logger.exception("on_change failed for %d devices", len(changed))

    # -- lease deadlines ---------------------------------------------------

    def _poke_deadline(self) -> None:
        deadline = self.cache.next_deadline()
        if deadline is None:
            return
        if self._sleeping_until is None or deadline < self._sleeping_until:
            self._wake.set()

    async def _deadline_loop(self) -> None:
        while True:
            self._wake.clear()
            deadline = self.cache.next_deadline()
            now = self._clock.now()
            if deadline is None or deadline >= now:
                # Leases expire strictly after the deadline: wake just past it.
                self._sleeping_until = deadline
                await self._wake.sleep(None if deadline is None else deadline - now + _EPSILON)
            self._sleeping_until = None
            changed = self.cache.expire(self._clock.now())
            self.lease_expiries += len(changed)
            await self._notify(changed)

"""Prometheus metrics and the ``/metrics``, ``/healthz``, ``/readyz`` server.

The kubelet exports nothing about DRA health; this is what an operator needs to see the
pipeline itself. Components do not import prometheus: they keep plain counters, the manager
turns them into a :class:`State` on the event loop, and :class:`Metrics` renders it at
scrape time. :class:`Server` serves the three paths from a thread, so a stalled event loop
can still be reported, and bounds what a client can hold (its docstring says how).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import http.server
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import prometheus_client
from prometheus_client import core, registry

from kubelet_dra import errors, waitroom

logger = logging.getLogger(__name__)

PREFIX = "kubelet_dra"
HTTP_REFUSED_REASONS = ("idle_timeout", "too_many_connections", "too_large", "bad_request")
"""Reasons of ``kubelet_dra_metrics_server_refused_total``."""
_LOG_EVERY = 60.0  # seconds between two log lines of one refusal reason
STREAM_STATES = ("connecting", "streaming", "backoff", "unimplemented", "stopped")


@dataclasses.dataclass(frozen=True)
class StreamInfo:
    driver: str
    endpoint: str
    service: str
    state: str
    reconnects: int


@dataclasses.dataclass(frozen=True)
class State:
    """Everything the collector renders, taken on the event loop."""

    streams: list[StreamInfo] = dataclasses.field(default_factory=list)
    reports: Mapping[str, int] = dataclasses.field(default_factory=dict)
    device_updates: Mapping[str, int] = dataclasses.field(default_factory=dict)
    last_report: Mapping[str, float] = dataclasses.field(default_factory=dict)
    refused: Mapping[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    registrations_refused: Mapping[str, int] = dataclasses.field(default_factory=dict)
    registration_failures: Mapping[str, int] = dataclasses.field(default_factory=dict)
    registry_ignored: Mapping[str, int] = dataclasses.field(default_factory=dict)
    checkpoint_refused: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: The kubelet's PodResources API client (``state.podresources``); None: not read.
    pod_resources_state: str | None = None
    pod_resources_fallback: Mapping[str, int] = dataclasses.field(default_factory=dict)
    pod_resources_reconnects: int = 0
    pod_resources_calls: Mapping[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    devices: Mapping[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    lease_expiries: int = 0
    pod_writes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    pending_pods: int = 0
    store_pending: int = 0
    store_degraded: bool = False
    store_errors: int = 0
    api_field_dropped: bool = False
    kubelet_removes_field: bool = False
    kubelet_owned_pods: int = 0
    field_removals: int = 0
    field_rewrites: int = 0
    now: float = 0.0
    taint_bridge: str | None = None  # starting, active or off; None: off by configuration
    taint_rules: Mapping[str, int] = dataclasses.field(default_factory=dict)  # by effect
    taint_writes: Mapping[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    #: asyncio tasks alive on the event loop (a leak of tasks shows as a rising count).
    loop_tasks: int = 0
    #: The status-PATCH transport's pool (``kube.asyncpatch``): open connections, the idle
    #: ones among them, and how many it opened. None: PATCHes go through the official
    #: client (or there is no API side), and the three series are left out.
    patch_connections: int | None = None
    patch_idle_connections: int = 0
    patch_connections_opened: int = 0


class Metrics:
    """The registry, the live histograms, and a collector over :class:`State`."""

    def __init__(self, state: Callable[[], State]) -> None:
        self.registry = registry.CollectorRegistry(auto_describe=True)
        # Registered first so that a scrape takes the state (which moves the
        # writer's latency samples into the histogram) before rendering them.
        self.registry.register(_Collector(state))
        self.write_latency = prometheus_client.Histogram(
            f"{PREFIX}_pod_write_duration_seconds",
            "Time to write one pod's status (all attempts).",
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.store_commit_latency = prometheus_client.Histogram(
            f"{PREFIX}_store_commit_duration_seconds",
            "Time to commit one batch of health records to the state file.",
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
        )

    def render(self) -> bytes:
        return bytes(prometheus_client.generate_latest(self.registry))


class _Collector(registry.Collector):
    def __init__(self, state: Callable[[], State]) -> None:
        self._state = state

    def collect(self) -> Iterator[core.Metric]:
        state = self._state()
        yield from _stream_metrics(state)
        yield from _driver_metrics(state)
        yield from _device_metrics(state)
        yield from _writer_metrics(state)
        yield from _patch_pool_metrics(state)
        yield from _store_metrics(state)
        yield _loop_metrics(state)
        if state.taint_bridge is not None:
            yield from _taint_metrics(state)
        if state.pod_resources_state is not None:
            yield from _pod_resources_metrics(state)


def _gauge(name: str, doc: str, labels: list[str]) -> core.GaugeMetricFamily:
    return core.GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)


def _counter(name: str, doc: str, labels: list[str]) -> core.CounterMetricFamily:
    return core.CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)


def _by_reason(
    metric: core.CounterMetricFamily | core.GaugeMetricFamily, counts: Mapping[str, float]
) -> core.CounterMetricFamily | core.GaugeMetricFamily:
    """``metric`` with one sample per reason of ``counts``."""
    for reason, count in counts.items():
        metric.add_metric([reason], count)
    return metric


def _stream_metrics(state: State) -> Iterator[core.Metric]:
    stream = _gauge(
        "stream_state",
        "1 for the current state of each driver endpoint's health stream.",
        ["driver", "endpoint", "service", "state"],
    )
    reconnects = _counter(
        "stream_reconnects", "Health stream reconnects per endpoint.", ["driver", "endpoint"]
    )
    for info in state.streams:
        for candidate in STREAM_STATES:
            value = 1.0 if candidate == info.state else 0.0
            stream.add_metric([info.driver, info.endpoint, info.service, candidate], value)
        reconnects.add_metric([info.driver, info.endpoint], info.reconnects)
    yield stream
    yield reconnects


def _driver_metrics(state: State) -> Iterator[core.Metric]:
    reports = _counter("reports", "Health reports received per driver.", ["driver"])
    updates = _counter("device_updates", "Device entries received per driver.", ["driver"])
    age = _gauge("last_report_age_seconds", "Seconds since the driver's last report.", ["driver"])
    for driver, count in state.reports.items():
        reports.add_metric([driver], count)
    for driver, count in state.device_updates.items():
        updates.add_metric([driver], count)
    for driver, when in state.last_report.items():
        age.add_metric([driver], max(0.0, state.now - when))
    refused = _counter(
        "refused", "Reports or device entries refused or altered, by reason.", ["driver", "reason"]
    )
    for (driver, reason), count in state.refused.items():
        refused.add_metric([driver, reason], count)
    # No driver label: a refused name may be anything (up to any length).
    registrations = _by_reason(
        _counter("registrations_refused", "Plugin registrations refused by validation, by reason.",
                 ["reason"]),
        state.registrations_refused,
    )  # fmt: skip
    failures = _by_reason(
        _counter(
            "registration_failures",
            "Registration attempts that failed and are retried (GetInfo errors), by gRPC code.",
            ["reason"],
        ),
        state.registration_failures,
    )
    ignored = _by_reason(
        _gauge("registry_ignored_entries",
               "Entries of the plugins registry the last scan passed over, by reason.", ["reason"]),
        state.registry_ignored,
    )  # fmt: skip
    checkpoint = _by_reason(
        _counter("checkpoint_refused",
                 "Reads of the kubelet's DRA checkpoint (dra_manager_state) refused, by reason.",
                 ["reason"]),
        state.checkpoint_refused,
    )  # fmt: skip
    yield from (reports, updates, age, refused, registrations, failures, ignored, checkpoint)


def _device_metrics(state: State) -> Iterator[core.Metric]:
    devices = _gauge(
        "devices", "Devices in the health cache by visible health.", ["driver", "health"]
    )
    for (driver, health), count in state.devices.items():
        devices.add_metric([driver, health], count)
    expiries = _counter("lease_expiries", "Devices turned Unknown when their lease ran out.", [])
    expiries.add_metric([], state.lease_expiries)
    yield devices
    yield expiries


def _loop_metrics(state: State) -> core.Metric:
    tasks = _gauge("event_loop_tasks", "asyncio tasks alive on the event loop.", [])
    tasks.add_metric([], state.loop_tasks)
    return tasks


def _patch_pool_metrics(state: State) -> Iterator[core.Metric]:
    # Each TLS connection holds about 54 KB (OpenSSL's state and the connection's buffers):
    # a step in memory with these risen is the pool filling, not a leak (docs/memory.md).
    if state.patch_connections is None:
        return
    open_ = _gauge("status_patch_connections", "Open connections of the status-PATCH pool.", [])
    open_.add_metric([], state.patch_connections)
    idle = _gauge(
        "status_patch_idle_connections", "Idle connections kept by the status-PATCH pool.", []
    )
    idle.add_metric([], state.patch_idle_connections)
    opened = _counter("status_patch_connections_opened", "Connections the pool opened.", [])
    opened.add_metric([], state.patch_connections_opened)
    yield from (open_, idle, opened)


def _writer_metrics(state: State) -> Iterator[core.Metric]:
    writes = _counter("pod_writes", "Pod status writes by result.", ["result"])
    for result, count in state.pod_writes.items():
        writes.add_metric([result], count)
    pending = _gauge("pending_pods", "Pods waiting for a status write.", [])
    pending.add_metric([], state.pending_pods)
    dropped = _gauge(
        "api_field_dropped",
        "1 when the API server drops allocatedResourcesStatus (ResourceHealthStatus gate off).",
        [],
    )
    dropped.add_metric([], 1.0 if state.api_field_dropped else 0.0)
    removes = _gauge(
        "kubelet_removes_field",
        "1 when the node's kubelet removes the allocatedResourcesStatus we write "
        "(its ResourceHealthStatus gate is off).",
        [],
    )
    removes.add_metric([], 1.0 if state.kubelet_removes_field else 0.0)
    owned = _gauge(
        "kubelet_owned_pods",
        "Pods whose allocatedResourcesStatus is left to the kubelet (it writes the field).",
        [],
    )
    owned.add_metric([], state.kubelet_owned_pods)
    removals = _counter(
        "field_removals", "Removals by another writer of allocatedResourcesStatus we wrote.", []
    )
    removals.add_metric([], state.field_removals)
    rewrites = _counter(
        "field_rewrites",
        "Rewrites by the kubelet, with entries of its own, of allocatedResourcesStatus we "
        "wrote (--container-status on; each backs the pod's field off like a removal).",
        [],
    )
    rewrites.add_metric([], state.field_rewrites)
    yield from (writes, pending, dropped, removes, owned, removals, rewrites)


def _store_metrics(state: State) -> Iterator[core.Metric]:
    degraded = _gauge(
        "store_degraded", "1 while the state file cannot be written (serving from memory).", []
    )
    degraded.add_metric([], 1.0 if state.store_degraded else 0.0)
    pending = _gauge("store_pending_records", "Health records waiting to be committed.", [])
    pending.add_metric([], state.store_pending)
    failures = _counter("store_errors", "Failed commits of the state file.", [])
    failures.add_metric([], state.store_errors)
    yield from (degraded, pending, failures)


TAINT_STATES = ("starting", "active", "off")
POD_RESOURCES_STATES = ("connecting", "ready", "backoff", "stopped")


def _pod_resources_metrics(state: State) -> Iterator[core.Metric]:
    conn = _gauge(
        "pod_resources_state", "1 for the state of the kubelet's PodResources API client.",
        ["state"],
    )  # fmt: skip
    for candidate in POD_RESOURCES_STATES:
        conn.add_metric([candidate], 1.0 if candidate == state.pod_resources_state else 0.0)
    fallback = _by_reason(
        _gauge("pod_resources_fallback",
               "1 while devices are named <driver>/<pool>/<device> because the kubelet's "
               "PodResources API gives no names, by reason.", ["reason"]),
        state.pod_resources_fallback,
    )  # fmt: skip
    reconnects = _counter(
        "pod_resources_reconnects", "Reconnects to the kubelet's PodResources API.", []
    )
    reconnects.add_metric([], state.pod_resources_reconnects)
    calls = _counter(
        "pod_resources_calls", "Calls to the kubelet's PodResources API by method and gRPC code.",
        ["method", "code"],
    )  # fmt: skip
    for (method, code), count in sorted(state.pod_resources_calls.items()):
        calls.add_metric([method, code], count)
    yield from (conn, fallback, reconnects, calls)


def _taint_metrics(state: State) -> Iterator[core.Metric]:
    bridge = _gauge(
        "taint_bridge", "1 for the taint bridge's state (off: see /readyz for why).", ["state"]
    )
    for candidate in TAINT_STATES:
        bridge.add_metric([candidate], 1.0 if candidate == state.taint_bridge else 0.0)
    rules = _gauge("taint_rules", "This node's DeviceTaintRules by effect.", ["effect"])
    for effect, count in sorted(state.taint_rules.items()):
        rules.add_metric([effect], count)
    writes = _counter(
        "taint_rule_writes", "DeviceTaintRule writes by operation and result.", ["op", "result"]
    )
    for (op, result), count in sorted(state.taint_writes.items()):
        writes.add_metric([op, result], count)
    yield from (bridge, rules, writes)


# -- the HTTP server -----------------------------------------------------------

Readiness = Callable[[], Mapping[str, str]]
"""Returns check name -> "ok" or the reason it is not ready."""

Notes = Callable[[], Mapping[str, str]]
"""Returns topic -> what an operator should know; shown in ``/readyz``, never failing it."""


class Server:
    """``/metrics``, ``/healthz`` and ``/readyz`` on one address, in a thread.

    ``state`` and ``readiness`` are evaluated on ``loop`` (the pipeline's
    event loop) so that they read consistent data; a loop that does not
    answer within ``stall_after`` seconds makes ``/healthz`` fail.

    The HTTP server runs in a thread so that a stalled event loop can still be
    reported: ``/healthz`` fails when the loop's heartbeat is older than
    ``stall_after`` seconds; ``/readyz`` answers 200 only when every readiness
    check passes and lists each check either way, with ``notes`` on what works
    but differently than configured (they never fail readiness).

    The port is a neighbour's to reach, so the server bounds what a client can
    hold (a hostile neighbour must not starve the probes): a connection that sends nothing
    within ``idle_timeout`` seconds is closed, and so is one whose next read of the request line
    or headers waits longer than that; until its first bytes a connection waits on one shared
    thread (:mod:`kubelet_dra.waitroom`), then gets a thread of its own; at most
    ``max_connections`` are open at once and a connection over that is closed at
    once; a request line over 64 KiB (414), a header line over 64 KiB or more than
    100 headers (431) are refused by ``http.server``.
    Each is counted in ``kubelet_dra_metrics_server_refused_total{reason}`` and
    logged (the first of each reason, then at most once a minute with the count).
    """

    def __init__(
        self,
        address: str,
        *,
        loop: asyncio.AbstractEventLoop,
        metrics: Metrics,
        readiness: Readiness,
        notes: Notes | None = None,
        stall_after: float = 10.0,
        idle_timeout: float = 10.0,
        max_connections: int = 256,
    ) -> None:
        self.host, self.port = parse_address(address)
        self._loop = loop
        self.metrics = metrics
        self._readiness = readiness
        self._notes = notes
        self.stall_after = stall_after
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.heartbeat = time.monotonic()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._refused_lock = threading.Lock()
        self.refused: dict[str, int] = dict.fromkeys(HTTP_REFUSED_REASONS, 0)
        self._logged_at: dict[str, float] = {}
        metrics.registry.register(_ServerCollector(self))

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        handler = _handler_for(self)
        try:
            self._httpd = _HTTPServer((self.host, self.port), handler, server=self)
        except OSError as exc:
            raise errors.ConfigError(f"cannot listen on {self.address}: {exc}") from exc
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="metrics", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def refuse(self, reason: str, client: str, detail: str) -> None:
        """Count a refused connection or request (any thread); log the first, then a minute's."""
        now = time.monotonic()
        with self._refused_lock:
            self.refused[reason] += 1
            count = self.refused[reason]
            last = self._logged_at.get(reason)
            if last is not None and now - last < _LOG_EVERY:
                return
            self._logged_at[reason] = now
        logger.warning(
            "metrics server: refused a connection from %s (%s: %s); %d refused for this reason",
            client,
            reason,
            detail,
            count,
        )

    async def beat(self, interval: float = 1.0) -> None:
        """Run on the loop: proves to ``/healthz`` that the loop is turning."""
        while True:
            self.heartbeat = time.monotonic()
            await asyncio.sleep(interval)

    def waiting(self) -> int:
        """Connections accepted that have sent nothing yet (they hold a slot, no thread)."""
        return self._httpd.room.waiting() if self._httpd is not None else 0

    def serving(self) -> int:
        """Connections of this server that hold a handler thread now (read from any thread)."""
        return self._httpd.serving() if self._httpd is not None else 0

    def stalled(self) -> bool:
        return time.monotonic() - self.heartbeat > self.stall_after

    def on_loop(self, fn: Callable[[], Any]) -> Any:
        async def call() -> Any:
            return fn()

        future = asyncio.run_coroutine_threadsafe(call(), self._loop)
        try:
            return future.result(timeout=self.stall_after)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise errors.KubeletDraError("event loop did not answer") from exc


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise errors.ConfigError(f"metrics address must be HOST:PORT, got {address!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class _HTTPServer(http.server.ThreadingHTTPServer):
    """At most ``max_connections`` open; a thread each only once it has sent something.

    An accepted connection holds a slot from the start (the cap bounds sockets, not only
    threads), then waits in a :class:`waitroom.WaitingRoom` until its first bytes arrive:
    a thousand idle neighbours cost one thread and a selector, not a thousand threads
    started ahead of the scrape that came after them.
    """

    daemon_threads = True
    # socketserver's default backlog is 5: a burst of connections (a neighbour
    # opening hundreds) would leave a scrape waiting for SYN retransmissions.
    request_queue_size = 1024

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[http.server.BaseHTTPRequestHandler],
        *,
        server: Server,
    ) -> None:
        self.owner = server
        self._slots = threading.BoundedSemaphore(server.max_connections)
        # Counted per server, not from thread names: another server in the process (the
        # API stand-in of a test, a second metrics port) runs threads of the same name.
        self._serving_lock = threading.Lock()
        self._serving = 0
        # Made before the bind: a port already taken makes socketserver call server_close
        # from its __init__, which closes the room (never started) with the socket.
        self.room = waitroom.WaitingRoom(
            server.idle_timeout, ready=self._serve, idle=self._idle, drop=self._close
        )
        super().__init__(address, handler)
        self.room.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.owner.refuse(
                "too_many_connections",
                _client(client_address),
                f"{self.owner.max_connections} connections are open",
            )
            self.shutdown_request(request)
            return
        self.room.add(request, client_address)

    def serving(self) -> int:
        with self._serving_lock:
            return self._serving

    def _count_serving(self, delta: int) -> None:
        with self._serving_lock:
            self._serving += delta

    def _serve(self, request: Any, client_address: Any) -> None:
        self._count_serving(+1)
        try:
            super().process_request(request, client_address)
        except Exception:  # no thread to be had: this connection goes, the port stays
            self._count_serving(-1)
            self.handle_error(request, client_address)
            self._close(request, client_address)

    def _idle(self, request: Any, client_address: Any) -> None:
        self.owner.refuse(
            "idle_timeout",
            _client(client_address),
            f"no request within {self.owner.idle_timeout:g} s",
        )
        self._close(request, client_address)

    def _close(self, request: Any, client_address: Any) -> None:
        self.shutdown_request(request)
        self._slots.release()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._count_serving(-1)
            self._slots.release()

    def server_close(self) -> None:
        self.room.close()
        super().server_close()


class _ServerCollector(registry.Collector):
    def __init__(self, server: Server) -> None:
        self._server = server

    def collect(self) -> Iterator[core.Metric]:
        refused = _counter(
            "metrics_server_refused",
            "Connections and requests the metrics server refused or closed, by reason.",
            ["reason"],
        )
        with self._server._refused_lock:
            counts = dict(self._server.refused)
        yield _by_reason(refused, counts)


def _client(address: Any) -> str:
    return str(address[0]) if isinstance(address, tuple) and address else str(address)


def _handler_for(server: Server) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        # A socket timeout per read: an idle or stalled client is let go.
        timeout = server.idle_timeout

        def send_error(
            self, code: int, message: str | None = None, explain: str | None = None
        ) -> None:
            if code in (414, 431):
                server.refuse("too_large", _client(self.client_address), f"{code} {message}")
            elif code == 400:
                server.refuse("bad_request", _client(self.client_address), f"{code} {message}")
            super().send_error(code, message, explain)

        def log_error(self, format: str, *args: Any) -> None:
            if format.startswith("Request timed out"):
                server.refuse(
                    "idle_timeout",
                    _client(self.client_address),
                    f"no whole request within {server.idle_timeout:g} s",
                )
                return
            logger.debug("metrics server: " + format, *args)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            route = {"/metrics": _metrics, "/healthz": _healthz, "/readyz": _readyz}.get(path)
            if route is None:
                self._send(404, "text/plain", b"not found\n")
                return
            code, ctype, body = route(server)
            self._send(code, ctype, body)

        def _send(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("metrics server: " + format, *args)

    return Handler


def _metrics(server: Server) -> tuple[int, str, bytes]:
    try:
        body = server.on_loop(server.metrics.render)
    except errors.KubeletDraError as exc:
        return 503, "text/plain", f"{exc}\n".encode()
    return 200, prometheus_client.CONTENT_TYPE_LATEST, body


def _healthz(server: Server) -> tuple[int, str, bytes]:
    if server.stalled():
        return 503, "text/plain", b"event loop stalled\n"
    return 200, "text/plain", b"ok\n"


def _readyz(server: Server) -> tuple[int, str, bytes]:
    notes: dict[str, str] = {}
    try:
        checks = dict(server.on_loop(server._readiness))
        if server._notes is not None:
            notes = dict(server.on_loop(server._notes))
    except errors.KubeletDraError as exc:
        checks = {"loop": str(exc)}
    ready = all(value == "ok" for value in checks.values())
    answer: dict[str, Any] = {"ready": ready, "checks": checks}
    if notes:
        answer["notes"] = notes  # only when there is something to say
    body = json.dumps(answer, sort_keys=True).encode() + b"\n"
    return (200 if ready else 503), "application/json", body

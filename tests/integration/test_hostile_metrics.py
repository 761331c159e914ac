"""Hostile neighbours of the metrics port (issue 22): idle connections and oversized requests.

Real TCP connections to a real ``metrics.Server``, the pipeline's loop in a
thread. Each neighbour must leave ``/metrics`` and ``/healthz`` answering,
be counted in ``kubelet_dra_metrics_server_refused_total{reason}`` and be
logged. ~3 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading

import pytest
from prometheus_client import parser

from kubelet_dra import metrics
from kubelet_dra.testing import eventually_sync

from ._http import get

IDLE = 0.5


def _server(loop: asyncio.AbstractEventLoop, **limits: float) -> metrics.Server:
    server = metrics.Server(
        "127.0.0.1:0",
        loop=loop,
        metrics=metrics.Metrics(lambda: metrics.State(lease_expiries=3)),
        readiness=lambda: {"store": "ok"},
        idle_timeout=limits.pop("idle_timeout", IDLE),
        **limits,  # type: ignore[arg-type]
    )
    server.start()
    return server


def _refused(server: metrics.Server, reason: str) -> float:
    _, text = get(f"http://{server.address}/metrics")
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "kubelet_dra_metrics_server_refused_total"
                and sample.labels["reason"] == reason
            ):
                return float(sample.value)
    raise AssertionError(f"no kubelet_dra_metrics_server_refused_total{{reason={reason!r}}}")


def _healthz_ok(server: metrics.Server) -> bool:
    """200 from /healthz; a connection still refused (no slot free yet) is "not yet"."""
    try:
        return get(f"http://{server.address}/healthz")[0] == 200
    except OSError:  # http.client's RemoteDisconnected is one
        return False


def _connect(server: metrics.Server) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=5)
    return sock


def test_a_thousand_idle_connections_are_let_go_and_the_port_keeps_answering(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "kubelet_dra.metrics")
    # Long enough an idle timeout that all 1,000 are open together on a loaded machine.
    server = _server(loop, max_connections=2000, idle_timeout=5)
    idle = [_connect(server) for _ in range(1000)]
    try:
        # All of them accepted, they wait on the one waiting-room thread, none on its own:
        # a scrape behind them is not queued behind a thousand thread starts.
        eventually_sync(lambda: server.waiting() == 1000, timeout=10)
        # This server's own count: threads of other servers in the process (an API
        # stand-in's watch left by an earlier test) have the same name and are not ours.
        assert server.serving() == 0
        assert get(f"http://{server.address}/healthz")[0] == 200
        assert get(f"http://{server.address}/metrics")[0] == 200
        # Each is closed by the server once its idle timeout passes without a byte.
        for sock in idle:
            sock.settimeout(10)
            assert sock.recv(1) == b""
        eventually_sync(lambda: _refused(server, "idle_timeout") == 1000, timeout=10)
        assert threading.active_count() < 100  # the threads went with them
    finally:
        for sock in idle:
            sock.close()
        server.stop()
    lines = [r.getMessage() for r in caplog.records if "idle_timeout" in r.getMessage()]
    assert lines and len(lines) <= 2, lines  # one line, not one per connection


def test_connections_over_the_cap_are_closed_at_once_and_counted(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "kubelet_dra.metrics")
    server = _server(loop, max_connections=20, idle_timeout=30)
    idle = [_connect(server) for _ in range(20)]
    try:
        # Every idle connection holds a slot once accepted, and waits without a thread.
        eventually_sync(lambda: server.waiting() == 20, timeout=10)
        extra = _connect(server)
        extra.settimeout(5)
        assert extra.recv(1) == b""  # closed without a thread
        extra.close()
        assert server.refused["too_many_connections"] >= 1
        assert any("too_many_connections" in r.getMessage() for r in caplog.records)
        for sock in idle:
            sock.close()
        # Slots come back as the idle ones go.
        eventually_sync(lambda: _healthz_ok(server), timeout=10)
        assert _refused(server, "too_many_connections") >= 1
    finally:
        for sock in idle:
            sock.close()
        server.stop()


@pytest.mark.parametrize(
    ("request_bytes", "code"),
    [
        pytest.param(b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414, id="request-line"),
        pytest.param(
            b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", 431, id="header"
        ),
        pytest.param(
            b"GET /metrics HTTP/1.1\r\n"
            + b"".join(b"X%d: y\r\n" % i for i in range(200))
            + b"\r\n",
            431,
            id="headers",
        ),
    ],
)
def test_an_oversized_request_is_refused_and_counted(
    loop: asyncio.AbstractEventLoop, request_bytes: bytes, code: int
) -> None:
    server = _server(loop)
    try:
        with _connect(server) as sock:
            sock.sendall(request_bytes)
            answer = sock.recv(100)
        assert answer.startswith(b"HTTP/1.0 %d" % code), answer
        assert _refused(server, "too_large") == 1
        assert get(f"http://{server.address}/metrics")[0] == 200
    finally:
        server.stop()


def test_a_huge_body_is_not_read_and_the_answer_comes(loop: asyncio.AbstractEventLoop) -> None:
    # A GET with a body the handler never reads: the answer comes, the body is dropped.
    server = _server(loop)
    try:
        with _connect(server) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nContent-Length: 100000000\r\n\r\n")
            # The answer comes before any of the body (read first: a server that closes
            # with unread data resets the connection, which may drop what it sent).
            answer = sock.recv(100)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b"x" * 1_000_000)  # not read: a broken pipe, or dropped
        assert answer.startswith(b"HTTP/1.0 200"), answer
    finally:
        server.stop()


def test_a_request_that_stops_halfway_is_closed_after_the_idle_timeout(
    loop: asyncio.AbstractEventLoop,
) -> None:
    # Its first bytes gave it a thread; the handler's read timeout lets it go.
    server = _server(loop)
    try:
        with _connect(server) as sock:
            sock.sendall(b"GET /metr")
            sock.settimeout(10)
            assert sock.recv(1) == b""
        eventually_sync(lambda: _refused(server, "idle_timeout") == 1, timeout=10)
        assert server.waiting() == 0
    finally:
        server.stop()

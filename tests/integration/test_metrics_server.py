"""The ``/metrics``, ``/healthz`` and ``/readyz`` server against an event loop we control.

The pipeline's loop runs in a thread here, so a test can block it on purpose
(``time.sleep`` scheduled on it) and see ``/healthz`` fail while the HTTP
server, in its own thread, still answers.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping

import pytest

from kubelet_dra import errors, metrics
from kubelet_dra.testing import eventually_sync

from ._http import get

STALL = 0.3


class Checks:
    """A readiness function whose answers the test sets."""

    def __init__(self) -> None:
        self.answers: dict[str, str] = {"store": "ok", "pods": "pod cache not synced"}

    def __call__(self) -> Mapping[str, str]:
        return dict(self.answers)


@pytest.fixture
def served(
    loop: asyncio.AbstractEventLoop,
) -> Iterator[tuple[metrics.Server, Checks, asyncio.AbstractEventLoop]]:
    checks = Checks()
    server = metrics.Server(
        "127.0.0.1:0",
        loop=loop,
        metrics=metrics.Metrics(lambda: metrics.State(lease_expiries=3)),
        readiness=checks,
        stall_after=STALL,
    )
    server.start()
    beat = asyncio.run_coroutine_threadsafe(server.beat(interval=0.02), loop)
    try:
        yield server, checks, loop
    finally:
        beat.cancel()
        server.stop()


def url(server: metrics.Server, path: str) -> str:
    return f"http://{server.address}{path}"


def test_readyz_lists_every_check_and_turns_200_when_all_pass(
    served: tuple[metrics.Server, Checks, asyncio.AbstractEventLoop],
) -> None:
    server, checks, _ = served
    code, body = get(url(server, "/readyz"))
    assert code == 503
    assert json.loads(body) == {
        "ready": False,
        "checks": {"store": "ok", "pods": "pod cache not synced"},
    }
    checks.answers["pods"] = "ok"
    code, body = get(url(server, "/readyz"))
    assert code == 200
    assert json.loads(body) == {"ready": True, "checks": {"store": "ok", "pods": "ok"}}


def test_healthz_fails_while_the_loop_is_blocked_and_recovers(
    served: tuple[metrics.Server, Checks, asyncio.AbstractEventLoop],
) -> None:
    server, _, loop = served
    assert get(url(server, "/healthz")) == (200, "ok\n")
    # Block the pipeline's loop (a stand-in for a stuck synchronous call).
    loop.call_soon_threadsafe(time.sleep, 1.5)
    eventually_sync(lambda: get(url(server, "/healthz"))[0] == 503)
    assert get(url(server, "/healthz")) == (503, "event loop stalled\n")
    # Metrics and readiness are read on the loop: they fail fast rather than hang.
    code, body = get(url(server, "/metrics"))
    assert (code, body) == (503, "event loop did not answer\n")
    code, body = get(url(server, "/readyz"))
    assert code == 503
    assert json.loads(body)["checks"] == {"loop": "event loop did not answer"}
    eventually_sync(lambda: get(url(server, "/healthz"))[0] == 200)


def test_metrics_are_rendered_in_the_prometheus_text_format(
    served: tuple[metrics.Server, Checks, asyncio.AbstractEventLoop],
) -> None:
    server, _, _ = served
    with urllib.request.urlopen(url(server, "/metrics"), timeout=5) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=")
        body = answer.read().decode()
    assert "kubelet_dra_lease_expiries_total 3.0" in body


def test_unknown_path_is_404(
    served: tuple[metrics.Server, Checks, asyncio.AbstractEventLoop],
) -> None:
    server, _, _ = served
    assert get(url(server, "/nope"))[0] == 404


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("0.0.0.0:80", ("0.0.0.0", 80)),
        (":9464", ("127.0.0.1", 9464)),
        ("[::1]:9464", ("::1", 9464)),
    ],
    ids=["ipv4", "all", "no-host", "ipv6"],
)
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert metrics.parse_address(address) == expected


@pytest.mark.parametrize(
    "address", ["9464", "host:", "host:port"], ids=["no-colon", "no-port", "port-name"]
)
def test_parse_address_refuses(address: str) -> None:
    with pytest.raises(errors.ConfigError, match="HOST:PORT"):
        metrics.parse_address(address)


def test_a_taken_port_is_a_config_error(loop: asyncio.AbstractEventLoop) -> None:
    first = metrics.Server(
        "127.0.0.1:0", loop=loop, metrics=metrics.Metrics(metrics.State), readiness=dict
    )
    first.start()
    try:
        second = metrics.Server(
            first.address, loop=loop, metrics=metrics.Metrics(metrics.State), readiness=dict
        )
        with pytest.raises(errors.ConfigError, match="cannot listen"):
            second.start()
    finally:
        first.stop()

"""A health stream that trickles one byte a second (issue 22), beside one that streams normally.

The slow driver's DRA endpoint is a real unix-socket proxy (``_trickle``)
that passes the driver's answers one byte a second, from the first byte of
the HTTP/2 handshake. The other driver's reports must keep landing in the
cache at their own pace, and the slow one must deliver nothing (its devices
are not made up). Short (default run, ~4 s): the trickle for 3 s. Long
(``-m slow``, ~30 s): gRPC gives up on the handshake (no SETTINGS frame within
its 20 s connect deadline); the stream ends ``UNAVAILABLE`` with one warning
line, counts a reconnect (``kubelet_dra_stream_reconnects_total``) and is
retried with backoff, and the good driver never noticed.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib

import pytest

from kubelet_dra import clock, models
from kubelet_dra.plugin import plugins, registration
from kubelet_dra.state import healthinfo
from kubelet_dra.testing import eventually, fakedriver

from ._driver_fixtures import Changes, make_settings
from ._trickle import trickle_proxy

GOOD = models.DeviceKey("gpu.example.com", "p", "d")
SLOW = models.DeviceKey("slow.example.com", "p", "d")


@pytest.mark.parametrize(
    "seconds",
    [3.0, pytest.param(30.0, marks=[pytest.mark.slow, pytest.mark.timeout(120)])],
    ids=["short", "long"],
)
async def test_a_trickling_stream_does_not_slow_the_others(
    sockdir: pathlib.Path,
    registry: pathlib.Path,
    caplog: pytest.LogCaptureFixture,
    seconds: float,
) -> None:
    caplog.set_level(logging.WARNING, "kubelet_dra.plugin.streams")
    proxy = sockdir / "slow.sock"
    settings = make_settings(registry_poll_interval=0.5)
    system = clock.SystemClock()
    cache = healthinfo.HealthCache()
    async with (
        fakedriver.FakeDriver("slow.example.com", registry=registry, advertised_endpoint=str(proxy))
        as slow,
        fakedriver.FakeDriver(registry=registry) as good,
        trickle_proxy(proxy, slow.dra_socket, every=1.0) as connections,
        plugins.PluginManager(cache, settings=settings, clock=system, on_change=Changes()) as mgr,
    ):  # fmt: skip
        await slow.set_health({"pool": "p", "device": "d", "health": "Unhealthy"}, resend=0.5)
        await good.set_health({"pool": "p", "device": "d", "health": "Healthy"}, resend=0.2)
        watcher = registration.RegistryWatcher(
            registry, role=settings.role, settings=settings, clock=system, on_event=mgr.handle
        )
        async with watcher:
            await eventually(lambda: bool(connections), timeout=10)
            slow_status = mgr.endpoints[str(proxy)]
            good_status = mgr.endpoints[str(good.dra_socket)]
            await eventually(lambda: good_status.reports >= 1, timeout=10)
            before = good_status.reports
            if seconds < 10:
                await asyncio.sleep(seconds)
            else:  # until gRPC gives the handshake up and we count the reconnect
                await eventually(lambda: slow_status.reconnects >= 1, timeout=seconds)
            # The good driver's reports kept coming at their pace (every 0.2 s).
            assert good_status.reports - before >= 5, (good_status.reports, before)
            assert cache.get(GOOD, system.now()).health is models.HealthStatus.HEALTHY
            # Nothing from the slow one, and nothing made up for it.
            assert slow_status.reports == 0
            assert SLOW not in dict(cache.records())
    warnings = [r.getMessage() for r in caplog.records if "slow.example.com" in r.getMessage()]
    if seconds < 10:
        assert warnings == []
    else:
        assert len(warnings) == 1 and "UNAVAILABLE" in warnings[0], warnings
        assert "SETTINGS" in slow_status.last_error, slow_status.last_error

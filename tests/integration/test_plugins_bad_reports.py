"""A misbehaving driver: floods, huge messages, many devices, bad names, duplicates."""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubelet_dra import clock, models
from kubelet_dra.plugin import plugins
from kubelet_dra.state import healthinfo
from kubelet_dra.testing import eventually, fakedriver

from ._driver_fixtures import Changes, NoJitter, device, make_settings, register

DRIVER = "gpu.example.com"


@contextlib.asynccontextmanager
async def manager_with(
    **overrides: Any,
) -> AsyncIterator[tuple[healthinfo.HealthCache, plugins.PluginManager, Changes]]:
    cache, changes = healthinfo.HealthCache(), Changes()
    manager = plugins.PluginManager(
        cache,
        settings=make_settings(**overrides),
        clock=clock.FakeClock(),
        on_change=changes,
        rng=NoJitter(),
    )
    async with manager:
        yield cache, manager, changes


async def test_flood_of_identical_reports_stays_up_and_notifies_once(
    registry: pathlib.Path,
) -> None:
    drv = fakedriver.FakeDriver(registry=registry)
    async with manager_with() as (_, manager, changes), drv:
        await drv.set_health(device("pool", "gpu-0"))
        await register(manager, drv)
        await eventually(lambda: manager.drivers[DRIVER].reports == 1)
        await drv.push(times=3000)
        await eventually(lambda: manager.drivers[DRIVER].reports == 3001, timeout=20)
        assert len(changes.calls) == 1
        await drv.set_health(device("pool", "gpu-0", "Unhealthy"))  # still listening
        await eventually(lambda: len(changes.calls) == 2)
        assert manager.endpoints[str(drv.dra_socket)].reconnects == 0


async def test_message_over_the_size_limit_is_refused_counted_and_the_stream_reopened(
    registry: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    drv = fakedriver.FakeDriver(registry=registry)
    async with manager_with(max_message_bytes=4096) as (_, manager, _), drv:
        await drv.set_health(device("pool", "gpu-0"))
        await register(manager, drv)
        await eventually(lambda: manager.drivers[DRIVER].reports == 1)
        await drv.set_health(device("pool", "gpu-0", message="x" * 8000))
        status = manager.endpoints[str(drv.dra_socket)]
        await eventually(lambda: manager.refused[DRIVER, "too_large"] == 1)
        await eventually(lambda: status.state == plugins.StreamState.BACKOFF)
        assert "RESOURCE_EXHAUSTED" in status.last_error
        assert manager.drivers[DRIVER].reports == 1


async def test_thousands_of_devices_in_one_report(registry: pathlib.Path) -> None:
    drv = fakedriver.FakeDriver(registry=registry)
    async with manager_with() as (cache, manager, changes), drv:
        await drv.set_health(*(device("pool", f"gpu-{i}") for i in range(5000)))
        await register(manager, drv)
        await eventually(lambda: len(cache) == 5000)
        assert len(changes.keys) == 5000


async def test_report_over_the_device_limit_is_refused(registry: pathlib.Path) -> None:
    drv = fakedriver.FakeDriver(registry=registry)
    async with manager_with(max_devices_per_report=100) as (cache, manager, _), drv:
        await drv.set_health(*(device("pool", f"gpu-{i}") for i in range(101)))
        await register(manager, drv)
        await eventually(lambda: manager.refused[DRIVER, "too_many_devices"] == 1)
        assert len(cache) == 0


async def test_bad_names_and_duplicates_are_counted_and_logged_once_per_reason(
    registry: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad = [
        device("", "gpu-0"),
        device("pool", ""),
        device("pool", "gpu-1", "Healthy"),
        device("pool", "gpu-1", "Unhealthy"),  # the last duplicate wins
        device("pool", "gpu-2", 99),
    ]
    drv = fakedriver.FakeDriver(registry=registry)
    async with manager_with() as (cache, manager, _), drv:
        await drv.set_health(*bad)
        await register(manager, drv)
        await eventually(lambda: manager.drivers[DRIVER].reports == 1)
        await drv.push(times=9)
        await eventually(lambda: manager.drivers[DRIVER].reports == 10)
        now = 1_700_000_000.0
        gpu1 = cache.get(models.DeviceKey(DRIVER, "pool", "gpu-1"), now)
        gpu2 = cache.get(models.DeviceKey(DRIVER, "pool", "gpu-2"), now)
        assert (gpu1.health, gpu2.health) == ("Unhealthy", "Unknown")
        assert len(cache) == 2
        assert dict(manager.refused) == {
            (DRIVER, "empty_name"): 20,
            (DRIVER, "duplicate"): 10,
            (DRIVER, "unknown_health"): 10,
        }
    logged = [r.getMessage() for r in caplog.records if "bad health report" in r.getMessage()]
    assert len(logged) == 3

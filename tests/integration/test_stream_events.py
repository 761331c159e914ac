"""``streams.watch``: one endpoint's stream as events, consumed without a PluginManager.

The generator is the stream's whole state machine; these tests read its events
and ``EndpointStatus`` directly, against a real ``FakeDriver`` over gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from kubelet_dra import clock, models
from kubelet_dra.plugin import plugins, streams
from kubelet_dra.state import healthinfo
from kubelet_dra.testing import eventually, fakedriver

from ._driver_fixtures import (
    Changes,
    NoJitter,
    device,
    make_settings,
    plugin_of,
    register,
)

StreamState = streams.StreamState


def _watch(
    drv: fakedriver.FakeDriver, fake_clock: clock.FakeClock
) -> tuple[streams.EndpointStatus, AsyncGenerator[streams.StreamEvent, None]]:
    plugin = plugin_of(drv)
    assert plugin.health_service is not None
    status = streams.EndpointStatus(plugin.driver, plugin.endpoint, plugin.health_service)
    events = streams.watch(
        plugin,
        status,
        settings=make_settings(),
        clock=fake_clock,
        rng=NoJitter(),
    )
    return status, events


def state(status: streams.EndpointStatus) -> StreamState:
    # A call, so that mypy does not narrow ``status.state`` across awaits.
    return status.state


async def _next(events: AsyncGenerator[streams.StreamEvent, None]) -> streams.StreamEvent:
    return await asyncio.wait_for(anext(events), 5)


async def test_events_and_states_of_one_stream(
    registry: pathlib.Path, fake_clock: clock.FakeClock
) -> None:
    async with fakedriver.FakeDriver(registry=registry) as drv:
        await drv.set_health(device("pool", "gpu-0", "Unhealthy", message="ECC"))
        status, events = _watch(drv, fake_clock)
        assert state(status) is StreamState.CONNECTING
        first = await _next(events)
        assert isinstance(first, streams.Report)
        assert [(r.device, r.health, r.message) for r in first.converted.reports] == [
            ("gpu-0", models.HealthStatus.UNHEALTHY, "ECC")
        ]
        assert state(status) is StreamState.STREAMING
        await drv.end_streams("INTERNAL")
        assert await _next(events) == streams.Ended(streams.Outcome.ERROR)
        assert status.last_error.startswith("INTERNAL")
        # In backoff as the end is handed over, before the consumer asks again: the
        # plugin manager's start-up wait, woken by the end, reads it as not connecting.
        assert state(status) is StreamState.BACKOFF
        # The backoff sleep happens when the consumer asks for the next event.
        reconnect = asyncio.ensure_future(_next(events))
        await fake_clock.wait_for_sleepers(1)
        assert state(status) is StreamState.BACKOFF and fake_clock.sleep_calls == [1.0]
        fake_clock.advance(1.0)
        assert isinstance(await reconnect, streams.Report)
        assert status.reconnects == 1
        await events.aclose()
        assert state(status) is StreamState.STOPPED


async def test_unimplemented_ends_the_generator(
    registry: pathlib.Path, fake_clock: clock.FakeClock
) -> None:
    async with fakedriver.FakeDriver(registry=registry, unimplemented=True) as drv:
        status, events = _watch(drv, fake_clock)
        assert await _next(events) == streams.Ended(streams.Outcome.UNIMPLEMENTED)
        with pytest.raises(StopAsyncIteration):
            await _next(events)
        assert state(status) is StreamState.UNIMPLEMENTED and status.reconnects == 0


async def test_a_bug_in_conversion_ends_the_stream_and_retries_after_the_cap(
    registry: pathlib.Path,
    fake_clock: clock.FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(devices: object, *, max_devices: int) -> streams.Converted:
        raise RuntimeError("bug")

    monkeypatch.setattr(streams, "convert", broken)
    async with fakedriver.FakeDriver(registry=registry) as drv:
        await drv.set_health(device("pool", "gpu-0"))
        status, events = _watch(drv, fake_clock)
        assert await _next(events) == streams.Ended(streams.Outcome.CRASHED)
        assert "crashed; restarting" in caplog.text
        retry = asyncio.ensure_future(_next(events))
        await fake_clock.wait_for_sleepers(1)
        assert fake_clock.sleep_calls == [make_settings().stream_backoff_max]
        retry.cancel()
        await asyncio.gather(retry, return_exceptions=True)
        await events.aclose()
        assert state(status) is StreamState.STOPPED


async def test_a_bug_applying_an_event_is_logged_once_and_the_stream_goes_on(
    registry: pathlib.Path,
    fake_clock: clock.FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache, changes = healthinfo.HealthCache(), Changes()
    failures: list[int] = []
    real_update = cache.update_entries

    def update_failing_twice(*args: Any, **kwargs: Any) -> list[models.DeviceKey]:
        if len(failures) < 2:
            failures.append(1)
            raise RuntimeError("bug")
        return real_update(*args, **kwargs)

    monkeypatch.setattr(cache, "update_entries", update_failing_twice)
    manager = plugins.PluginManager(
        cache, settings=make_settings(), clock=fake_clock, on_change=changes
    )
    async with manager, fakedriver.FakeDriver(registry=registry) as drv:
        await drv.set_health(device("pool", "gpu-0"))
        await register(manager, drv)
        await eventually(lambda: len(failures) == 1)
        await drv.push(times=2)
        await eventually(lambda: bool(changes.calls))
        status = manager.endpoints[str(drv.dra_socket)]
        assert state(status) is StreamState.STREAMING and status.reconnects == 0
    tracebacks = [r for r in caplog.records if "applying a stream event failed" in r.message]
    assert len(tracebacks) == 1 and tracebacks[0].exc_info is not None
    assert tracebacks[0].levelno >= logging.WARNING

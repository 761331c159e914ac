"""``PluginManager.wait_primed``: the manager's start-up wait for the first reports.

The manager holds its writer (or the node agent's callback) until every stream present at
start delivered a report or ended, for at most ``startup_grace``. The wait is woken by the
stream events themselves: on the fake clock, a quiet stream leaves it parked on one
sleep of the whole grace, no poll, and a report or an end ends it without the clock moving.
Each test runs against a real ``FakeDriver`` over gRPC.
"""

from __future__ import annotations

import asyncio
import pathlib

from kubelet_dra import clock
from kubelet_dra.plugin import plugins
from kubelet_dra.state import healthinfo
from kubelet_dra.testing import fakedriver

from ._driver_fixtures import Changes, device, register

Stack = tuple[healthinfo.HealthCache, plugins.PluginManager, Changes]
GRACE = 10.0


async def _parked(
    manager: plugins.PluginManager, drv: fakedriver.FakeDriver, fake_clock: clock.FakeClock
) -> asyncio.Future[bool]:
    """Register ``drv`` (silent: its stream opens, no report), then start the wait and
    return it once it sleeps on the clock."""
    drv.set_silent()
    await drv.set_health(device("pool", "gpu-0"))
    await register(manager, drv)
    await drv.wait_for_streams(1)
    before = fake_clock.sleepers
    wait = asyncio.ensure_future(manager.wait_primed(GRACE))
    await fake_clock.wait_for_sleepers(before + 1)
    assert not wait.done() and not manager.primed()
    return wait


async def test_no_endpoint_is_primed_at_once(stack: Stack, fake_clock: clock.FakeClock) -> None:
    _, manager, _ = stack
    assert await asyncio.wait_for(manager.wait_primed(GRACE), 5) is True
    assert fake_clock.sleep_calls == []


async def test_a_quiet_stream_holds_the_wait_for_the_grace_on_one_sleep(
    stack: Stack, registry: pathlib.Path, fake_clock: clock.FakeClock
) -> None:
    _, manager, _ = stack
    async with fakedriver.FakeDriver(registry=registry) as drv:
        wait = await _parked(manager, drv, fake_clock)
        # One sleep of the whole grace: no poll while nothing happens.
        assert fake_clock.sleep_calls.count(GRACE) == 1
        assert all(s == GRACE for s in fake_clock.sleep_calls), fake_clock.sleep_calls
        fake_clock.advance(GRACE - 0.5)
        await asyncio.sleep(0.05)
        assert not wait.done()
        fake_clock.advance(0.5)
        assert await asyncio.wait_for(wait, 5) is False


async def test_the_first_report_ends_the_wait_without_the_clock_moving(
    stack: Stack, registry: pathlib.Path, fake_clock: clock.FakeClock
) -> None:
    cache, manager, _ = stack
    async with fakedriver.FakeDriver(registry=registry) as drv:
        wait = await _parked(manager, drv, fake_clock)
        start = fake_clock.now()
        drv.set_silent(False)
        await drv.push()
        assert await asyncio.wait_for(wait, 5) is True
        assert fake_clock.now() == start
        assert len(cache) == 1


async def test_a_stream_that_ends_before_its_first_report_ends_the_wait(
    stack: Stack, registry: pathlib.Path, fake_clock: clock.FakeClock
) -> None:
    _, manager, _ = stack
    async with fakedriver.FakeDriver(registry=registry) as drv:
        wait = await _parked(manager, drv, fake_clock)
        start = fake_clock.now()
        await drv.end_streams("INTERNAL")
        # The end is applied with the stream already in backoff: primed, not connecting.
        assert await asyncio.wait_for(wait, 5) is True
        assert fake_clock.now() == start
        [status] = manager.endpoints.values()
        assert status.state is plugins.StreamState.BACKOFF and status.reports == 0

"""Many endpoints of one driver: every one streams, as in the kubelet, up to a high bound.

The kubelet's ``add`` (``dra_plugin_manager.go``) streams from every endpoint a
driver registers. These tests register five and six real FakeDrivers of one driver
(each on its own socket) and check that the newest endpoints' reports reach the
cache, and that an old endpoint going away ends only what it reported last. Over
``plugins.MAX_ENDPOINTS_PER_DRIVER`` the *oldest* stream stops (never the newest),
counted as ``too_many_endpoints``; the endpoint stays registered until it goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib

import pytest

from kubelet_dra import clock, models
from kubelet_dra.plugin import getinfo, plugins, registration
from kubelet_dra.state import healthinfo
from kubelet_dra.testing import eventually, fakedriver

from ._driver_fixtures import Changes, deregister, device, register

Stack = tuple[healthinfo.HealthCache, plugins.PluginManager, Changes]
DRIVER = "gpu.example.com"
GPU0 = models.DeviceKey(DRIVER, "pool", "gpu-0")
GPU1 = models.DeviceKey(DRIVER, "pool", "gpu-1")


def health(cache: healthinfo.HealthCache, key: models.DeviceKey, now: float) -> str:
    return str(cache.get(key, now).health)


@pytest.mark.parametrize("count", [5, 6])
async def test_every_endpoint_of_a_driver_streams_and_the_newest_reports_count(
    sockdir: pathlib.Path, stack: Stack, fake_clock: clock.FakeClock, count: int
) -> None:
    cache, manager, changes = stack
    async with contextlib.AsyncExitStack() as stack_:
        drivers = [
            await stack_.enter_async_context(
                fakedriver.FakeDriver(
                    DRIVER, registry=sockdir / f"reg{i}", plugin_dir=sockdir / f"p{i}"
                )
            )
            for i in range(count)
        ]
        await drivers[0].set_health(device("pool", "gpu-0"), device("pool", "gpu-1"))
        infos = [await register(manager, drv) for drv in drivers]
        for drv in drivers:
            await drv.wait_for_streams(1)
        await eventually(lambda: changes.keys == {GPU0, GPU1})
        # One stream per endpoint (a driver without devices sends nothing yet).
        assert len(manager.endpoints) == count
        assert plugins.StreamState.STOPPED not in {s.state for s in manager.endpoints.values()}
        assert manager.refused[DRIVER, "too_many_endpoints"] == 0

        # The newest endpoints take the devices over and change their health.
        await drivers[-1].set_health(device("pool", "gpu-0", "Unhealthy"))
        await eventually(lambda: health(cache, GPU0, fake_clock.now()) == "Unhealthy")
        await drivers[-2].set_health(device("pool", "gpu-1", "Unhealthy"))
        await eventually(lambda: health(cache, GPU1, fake_clock.now()) == "Unhealthy")

        # The oldest goes away: it reported neither device last, so nothing changes.
        changes.calls.clear()
        await deregister(manager, infos[0])
        assert changes.calls == []
        assert health(cache, GPU0, fake_clock.now()) == "Unhealthy"
        assert health(cache, GPU1, fake_clock.now()) == "Unhealthy"
        assert len(manager.endpoints) == count - 1
        await eventually(lambda: drivers[0].open_streams == 0)

        # A middle one goes away: it owns nothing either; the newest still streams.
        await deregister(manager, infos[1])
        await drivers[-1].set_health(device("pool", "gpu-0"), device("pool", "gpu-1"))
        await eventually(lambda: health(cache, GPU1, fake_clock.now()) == "Healthy")
        assert health(cache, GPU0, fake_clock.now()) == "Healthy"
        assert [drv.open_streams for drv in drivers] == [0, 0] + [1] * (count - 2)


async def test_over_the_bound_the_oldest_stream_stops_not_the_newest(
    sockdir: pathlib.Path, registry: pathlib.Path, stack: Stack, fake_clock: clock.FakeClock
) -> None:
    cache, manager, changes = stack
    bound, extra = plugins.MAX_ENDPOINTS_PER_DRIVER, 2
    async with fakedriver.FakeDriver(DRIVER, registry=registry) as drv:
        aliases = sockdir / "aliases"
        aliases.mkdir()
        infos = []
        for i in range(bound + extra):  # endpoint paths of one driver process
            alias = aliases / f"e{i}.sock"
            alias.symlink_to(drv.dra_socket)
            infos.append(getinfo.make_plugin_info(DRIVER, str(alias), drv.supported_versions))
        for info in infos[:bound]:
            await manager.handle(registration.PluginEvent(registration.EventKind.REGISTER, info))
        await drv.set_health(device("pool", "gpu-0"))
        await drv.wait_for_streams(bound)
        await eventually(lambda: health(cache, GPU0, fake_clock.now()) == "Healthy")
        assert manager.refused[DRIVER, "too_many_endpoints"] == 0

        for info in infos[bound:]:
            await manager.handle(registration.PluginEvent(registration.EventKind.REGISTER, info))
        states = {p: s.state for p, s in manager.endpoints.items()}
        assert [states[i.endpoint] for i in infos[:extra]] == [plugins.StreamState.STOPPED] * extra
        assert all(states[i.endpoint] != plugins.StreamState.STOPPED for i in infos[extra:])
        assert manager.refused[DRIVER, "too_many_endpoints"] == extra
        await eventually(lambda: drv.open_streams == bound)
        await eventually(
            lambda: all(
                manager.endpoints[i.endpoint].state == plugins.StreamState.STREAMING
                for i in infos[-extra:]
            )
        )
        # The newest endpoints stream: a change reaches the cache.
        await drv.set_health(device("pool", "gpu-0", "Unhealthy"))
        await eventually(lambda: health(cache, GPU0, fake_clock.now()) == "Unhealthy")
        # A stopped endpoint stays registered (a second registration is still refused)
        # until it goes away; its deregistration changes nothing more.
        assert [p.endpoint for p in manager.plugins][:extra] == [i.endpoint for i in infos[:extra]]
        await manager.handle(registration.PluginEvent(registration.EventKind.REGISTER, infos[0]))
        assert manager.endpoints[infos[0].endpoint].state == plugins.StreamState.STOPPED
        changes.calls.clear()
        for info in infos[:extra]:
            await deregister(manager, info)
        assert changes.calls == []
        assert infos[0].endpoint not in manager.endpoints
        assert manager.refused[DRIVER, "too_many_endpoints"] == extra
        assert drv.open_streams == bound
        assert health(cache, GPU0, fake_clock.now()) == "Unhealthy"


async def test_a_cancelled_close_still_cancels_every_task(
    sockdir: pathlib.Path, stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owner that gives up waiting on ``close`` (its shutdown timeout) leaves no
    stream or deadline task running into a closed event loop."""
    _, manager, _ = stack
    async with fakedriver.FakeDriver(DRIVER, registry=sockdir / "reg") as drv:
        await register(manager, drv)
        await drv.wait_for_streams(1)
        tasks = [e.task for e in manager._endpoints.values() if e.task is not None]
        deadline_task = manager._deadline_task
        assert tasks and deadline_task is not None

        async def hangs(endpoint: str) -> None:
            await asyncio.Event().wait()

        monkeypatch.setattr(manager, "_remove", hangs)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(manager.close(), 0.2)
        await asyncio.sleep(0)  # let the cancellations land
        assert deadline_task.done() and all(t.cancelling() or t.done() for t in tasks)

"""Health streams: negotiation, stream ends (the lease outlives them), backoff, rolling upgrade."""

from __future__ import annotations

import pathlib

import pytest

from kubelet_dra import clock, models
from kubelet_dra.plugin import plugins
from kubelet_dra.state import healthinfo
from kubelet_dra.testing import eventually, fakedriver

from ._driver_fixtures import Changes, deregister, device, register

Stack = tuple[healthinfo.HealthCache, plugins.PluginManager, Changes]
GPU0 = models.DeviceKey("gpu.example.com", "pool", "gpu-0")


def health(cache: healthinfo.HealthCache, key: models.DeviceKey, now: float) -> str:
    return str(cache.get(key, now).health)


@pytest.mark.parametrize(
    ("versions", "method"),
    [(("v1",), "v1"), (("v1alpha1",), "v1alpha1"), (("v1", "v1alpha1"), "v1")],
    ids=["v1-only", "v1alpha1-only", "both-prefers-v1"],
)
async def test_stream_uses_negotiated_version_and_converts_reports(
    registry: pathlib.Path, stack: Stack, fake_clock: clock.FakeClock, versions, method
) -> None:
    cache, manager, changes = stack
    async with fakedriver.FakeDriver(registry=registry, health_versions=versions) as drv:
        await drv.set_health(device("pool", "gpu-0", "Unhealthy", message="ECC", timeout_seconds=7))
        await register(manager, drv)
        await eventually(lambda: changes.keys == {GPU0})
        record = cache.get(GPU0, fake_clock.now())
        assert (record.health, record.message, record.lease) == ("Unhealthy", "ECC", 7.0)
        assert drv.calls[f"NodeWatchResources/{method}"] == 1
        other = "v1alpha1" if method == "v1" else "v1"
        assert drv.calls[f"NodeWatchResources/{other}"] == 0
        assert manager.endpoints[str(drv.dra_socket)].state == plugins.StreamState.STREAMING


async def test_no_health_service_means_no_stream(registry: pathlib.Path, stack: Stack) -> None:
    _, manager, _ = stack
    async with fakedriver.FakeDriver(registry=registry, health_versions=()) as drv:
        await register(manager, drv)
        assert manager.endpoints == {}
        assert [p.driver for p in manager.plugins] == [drv.name]
        assert sum(n for m, n in drv.calls.items() if m.startswith("NodeWatch")) == 0


async def test_unimplemented_is_called_exactly_once(
    registry: pathlib.Path, stack: Stack, fake_clock: clock.FakeClock
) -> None:
    _, manager, _ = stack
    async with fakedriver.FakeDriver(registry=registry, unimplemented=True) as drv:
        info = await register(manager, drv)
        status = manager.endpoints[str(drv.dra_socket)]
        await eventually(lambda: status.state == plugins.StreamState.UNIMPLEMENTED)
        parked = fake_clock.sleepers
        fake_clock.advance(3600)  # the kubelet 1.36 would have retried 720 times
        # Whatever woke (a wrong retry's backoff included) has run and is parked again.
        await fake_clock.wait_for_sleepers(parked)
        assert drv.calls["NodeWatchResources/v1"] == 1
        assert (status.state, status.reconnects) == (plugins.StreamState.UNIMPLEMENTED, 0)
        # Re-registration (a new driver pod) is the only way to try again.
        await deregister(manager, info)
        await register(manager, drv)
        await drv.wait_for_calls("NodeWatchResources/v1", 2)


@pytest.mark.parametrize(
    "code", [None, "INTERNAL", "UNAVAILABLE"], ids=["eof", "internal", "unavailable"]
)
async def test_stream_end_and_a_reconnect_within_the_lease_change_nothing(
    registry: pathlib.Path, stack: Stack, fake_clock: clock.FakeClock, code
) -> None:
    # A driver restarted on the same socket within the lease (a DaemonSet
    # update without surge): no change announced, no Unknown in between.
    cache, manager, changes = stack
    async with fakedriver.FakeDriver(registry=registry) as drv:
        await drv.set_health(
            device("pool", "gpu-0", "Unhealthy", message="ECC", timeout_seconds=10)
        )
        await register(manager, drv)
        await eventually(lambda: changes.keys == {GPU0})
        changes.calls.clear()
        status = manager.endpoints[str(drv.dra_socket)]
        await drv.end_streams(code)
        await eventually(lambda: status.state == plugins.StreamState.BACKOFF)
        assert cache.get(GPU0, fake_clock.now()).visible(fake_clock.now()) == ("Unhealthy", "ECC")
        fake_clock.advance(1.0)  # the first backoff (no jitter)
        await eventually(lambda: status.reports == 2)
        assert changes.calls == []
        assert health(cache, GPU0, fake_clock.now()) == "Unhealthy"


async def test_driver_away_past_the_lease_is_unknown_at_the_deadline_then_back(
    registry: pathlib.Path, stack: Stack, fake_clock: clock.FakeClock
) -> None:
    cache, manager, changes = stack
    async with fakedriver.FakeDriver(registry=registry) as drv:
        await drv.set_health(device("pool", "gpu-0", "Unhealthy", timeout_seconds=10))
        await register(manager, drv)
        await eventually(lambda: changes.keys == {GPU0})
        changes.calls.clear()
        status = manager.endpoints[str(drv.dra_socket)]
        await drv.stop()  # killed: its streams break and its sockets are gone
        await eventually(lambda: status.state == plugins.StreamState.BACKOFF)
        # Parked: the stream in its backoff, the deadline task at the lease end; nothing else
        # is left to run that could announce a change.
        await fake_clock.wait_for_sleepers(2)
        assert changes.calls == []
        fake_clock.advance(10.1)  # past the lease; reconnects fail meanwhile
        await eventually(lambda: changes.calls == [[GPU0]])
        assert health(cache, GPU0, fake_clock.now()) == "Unknown"
        assert list(cache.records()) == []  # nothing kept of the vanished stream
        await drv.start()  # back on the same socket
        fake_clock.advance(8.0)  # beyond the backoff cap
        await eventually(lambda: status.reports == 2)
        assert changes.calls == [[GPU0], [GPU0]]
        assert health(cache, GPU0, fake_clock.now()) == "Unhealthy"


async def test_deregistered_driver_keeps_health_for_its_lease_then_unknown_and_deleted(
    registry: pathlib.Path, stack: Stack, fake_clock: clock.FakeClock
) -> None:
    cache, manager, changes = stack
    async with fakedriver.FakeDriver(registry=registry) as drv:
        await drv.set_health(device("pool", "gpu-0", "Unhealthy", timeout_seconds=10))
        info = await register(manager, drv)
        await drv.wait_for_streams(1)
        await eventually(lambda: changes.keys == {GPU0})
        changes.calls.clear()
        await deregister(manager, info)
        await drv.stop()  # and it never comes back
        assert changes.calls == []
        assert health(cache, GPU0, fake_clock.now()) == "Unhealthy"
        assert manager.endpoints == {}
        fake_clock.advance(9.9)
        await fake_clock.wait_for_sleepers(1)  # the deadline task, parked until the lease end
        assert changes.calls == []
        fake_clock.advance(0.2)
        await eventually(lambda: changes.calls == [[GPU0]])
        assert health(cache, GPU0, fake_clock.now()) == "Unknown"
        assert (list(cache.records()), cache.drivers()) == ([], [])
        assert manager.lease_expiries == 1


async def test_reconnect_backoff_doubles_to_the_cap(
    registry: pathlib.Path, stack: Stack, fake_clock: clock.FakeClock
) -> None:
    _, manager, _ = stack
    async with fakedriver.FakeDriver(registry=registry) as drv:
        await register(manager, drv)
        status = manager.endpoints[str(drv.dra_socket)]
        delays = []
        for attempt in range(1, 7):
            await drv.wait_for_streams(1)
            await drv.end_streams("INTERNAL")
            await fake_clock.wait_for_sleepers(1)  # the backoff (no lease: no deadline sleeper)
            delays.append(fake_clock.sleep_calls[-1])
            fake_clock.advance(fake_clock.sleep_calls[-1])
            await eventually(lambda: status.reconnects == attempt)  # noqa: B023  # awaited here
        assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
        assert drv.calls["NodeWatchResources/v1"] == 7


async def test_backoff_resets_after_a_healthy_period(
    registry: pathlib.Path, stack: Stack, fake_clock: clock.FakeClock
) -> None:
    _, manager, _ = stack
    async with fakedriver.FakeDriver(registry=registry) as drv:
        await drv.set_health(device("pool", "gpu-0", timeout_seconds=3600))
        await register(manager, drv)
        status = manager.endpoints[str(drv.dra_socket)]
        for attempt in (1, 2):  # two quick failures: 1 s then 2 s
            await eventually(lambda: status.state == plugins.StreamState.STREAMING)
            await drv.end_streams("INTERNAL")
            await eventually(lambda: status.state == plugins.StreamState.BACKOFF)
            fake_clock.advance(fake_clock.sleep_calls[-1])
            await eventually(lambda: status.reconnects == attempt)  # noqa: B023  # awaited here
        await eventually(lambda: status.state == plugins.StreamState.STREAMING)
        fake_clock.advance(61)  # streamed longer than stream_backoff_reset_after
        await drv.end_streams("INTERNAL")
        await eventually(lambda: status.state == plugins.StreamState.BACKOFF)
        assert fake_clock.sleep_calls[-1] == 1.0


async def test_rolling_upgrade_old_endpoint_end_keeps_new_endpoint_devices(
    sockdir: pathlib.Path, registry: pathlib.Path, stack: Stack, fake_clock: clock.FakeClock
) -> None:
    cache, manager, changes = stack
    old = fakedriver.FakeDriver(registry=registry, plugin_dir=sockdir / "old")
    new = fakedriver.FakeDriver(registry=sockdir / "reg2", plugin_dir=sockdir / "new")
    gpu1 = models.DeviceKey("gpu.example.com", "pool", "gpu-1")
    async with old, new:
        await old.set_health(device("pool", "gpu-0"), device("pool", "gpu-1", timeout_seconds=10))
        old_info = await register(manager, old)
        await eventually(lambda: changes.keys == {GPU0, gpu1})
        # The new pod starts and reports gpu-0 (now owned by it); gpu-1 only the old one had.
        await new.set_health(device("pool", "gpu-0", "Unhealthy", timeout_seconds=3600))
        await register(manager, new)
        await eventually(lambda: health(cache, GPU0, fake_clock.now()) == "Unhealthy")
        changes.calls.clear()
        await deregister(manager, old_info)
        assert changes.calls == []
        assert health(cache, GPU0, fake_clock.now()) == "Unhealthy"
        assert health(cache, gpu1, fake_clock.now()) == "Healthy"  # until its lease ends
        fake_clock.advance(10.1)
        await eventually(lambda: changes.calls == [[gpu1]])
        assert health(cache, GPU0, fake_clock.now()) == "Unhealthy"
        assert health(cache, gpu1, fake_clock.now()) == "Unknown"


async def test_lease_expires_at_the_deadline_without_another_report(
    registry: pathlib.Path, stack: Stack, fake_clock: clock.FakeClock
) -> None:
    cache, manager, changes = stack
    async with fakedriver.FakeDriver(registry=registry) as drv:
        await drv.set_health(device("pool", "gpu-0", timeout_seconds=10))
        await register(manager, drv)
        await eventually(lambda: changes.keys == {GPU0})
        changes.calls.clear()
        await fake_clock.wait_for_sleepers(1)
        parked = fake_clock.sleepers
        fake_clock.advance(9.9)
        # An early deadline would have woken the deadline task: wait until it ran and
        # is parked again before looking.
        await fake_clock.wait_for_sleepers(parked)
        assert changes.calls == []
        fake_clock.advance(0.2)  # just past the deadline: the stream is still open and silent
        await eventually(lambda: changes.calls == [[GPU0]])
        assert health(cache, GPU0, fake_clock.now()) == "Unknown"
        assert manager.lease_expiries == 1


async def test_deadline_task_wakes_early_for_a_nearer_deadline(
    registry: pathlib.Path, stack: Stack, fake_clock: clock.FakeClock
) -> None:
    cache, manager, changes = stack
    async with fakedriver.FakeDriver(registry=registry) as drv:
        await drv.set_health(device("pool", "gpu-0", timeout_seconds=100))
        await register(manager, drv)
        await eventually(lambda: changes.keys == {GPU0})
        await fake_clock.wait_for_sleepers(1)
        await drv.set_health(
            device("pool", "gpu-0", timeout_seconds=100), device("pool", "gpu-1", timeout_seconds=5)
        )
        gpu1 = models.DeviceKey("gpu.example.com", "pool", "gpu-1")
        await eventually(lambda: gpu1 in changes.keys)
        changes.calls.clear()
        await eventually(
            lambda: (
                fake_clock.sleepers == 1 and 5.0 in [round(s, 1) for s in fake_clock.sleep_calls]
            )
        )
        fake_clock.advance(5.1)
        await eventually(lambda: changes.calls == [[gpu1]])
        assert health(cache, GPU0, fake_clock.now()) == "Healthy"

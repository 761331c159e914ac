"""Fixtures and helpers for the discovery, stream, fake-driver and watch tests.

Unix socket paths are limited to 107 bytes, so sockets live in a short
``/tmp/kd*`` directory rather than pytest's ``tmp_path``.
"""

from __future__ import annotations

import asyncio
import pathlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from kubelet_dra import clock, healthinfo, models, plugins, registration, settings


@pytest.fixture
def sockdir() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="kd", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def registry(sockdir: pathlib.Path) -> pathlib.Path:
    path = sockdir / "reg"
    path.mkdir()
    return path


def make_settings(**overrides: object) -> settings.Settings:
    values: dict[str, object] = {
        "registry_poll_interval": 0.02,
        "get_info_timeout": 0.3,
        "registration_backoff_initial": 0.5,
        "registration_backoff_max": 4.0,
        "stream_backoff_initial": 1.0,
        "stream_backoff_max": 8.0,
        "stream_backoff_reset_after": 60.0,
    }
    values.update(overrides)
    return settings.Settings(**values)  # type: ignore[arg-type]


async def wait_until(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    """Poll ``predicate`` until it is true; fail after ``timeout`` real seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.005)


class Changes:
    """An ``on_change`` callback that records every call."""

    def __init__(self) -> None:
        self.calls: list[list[models.DeviceKey]] = []

    async def __call__(self, changed: list[models.DeviceKey]) -> None:
        self.calls.append(list(changed))

    @property
    def keys(self) -> set[models.DeviceKey]:
        return {key for call in self.calls for key in call}


class Events:
    """An ``on_event`` callback that records registration events."""

    def __init__(self) -> None:
        self.events: list[registration.PluginEvent] = []

    async def __call__(self, event: registration.PluginEvent) -> None:
        self.events.append(event)

    def kinds(self, driver: str | None = None) -> list[str]:
        return [str(e.kind) for e in self.events if driver is None or e.plugin.driver == driver]


class NoJitter:
    """An rng whose jitter is zero, so backoff delays are exact."""

    def uniform(self, a: float, b: float) -> float:
        return (a + b) / 2


@pytest.fixture
def fake_clock() -> clock.FakeClock:
    return clock.FakeClock()


@pytest.fixture
async def stack(
    fake_clock: clock.FakeClock,
) -> AsyncIterator[tuple[healthinfo.HealthCache, plugins.PluginManager, Changes]]:
    """A health cache and a started PluginManager on the fake clock."""
    cache = healthinfo.HealthCache()
    changes = Changes()
    manager = plugins.PluginManager(
        cache,
        settings=make_settings(),
        clock=fake_clock,
        on_change=changes,
        rng=NoJitter(),  # type: ignore[arg-type]
    )
    async with manager:
        yield cache, manager, changes


def device(pool: str, name: str, health: str = "Healthy", **extra: object) -> dict[str, object]:
    return {"pool": pool, "device": name, "health": health, **extra}


def plugin_of(driver: object) -> registration.PluginInfo:
    """The registration a watcher would produce for a ``FakeDriver``."""
    from kubelet_dra.testing import fakedriver

    assert isinstance(driver, fakedriver.FakeDriver)
    return registration.make_plugin_info(
        driver.name,
        str(driver.dra_socket),
        driver.supported_versions,
        socket=str(driver.registration_socket),
    )


async def register(manager: plugins.PluginManager, driver: object) -> registration.PluginInfo:
    info = plugin_of(driver)
    await manager.handle(registration.PluginEvent(registration.EventKind.REGISTER, info))
    return info


async def deregister(manager: plugins.PluginManager, info: registration.PluginInfo) -> None:
    await manager.handle(registration.PluginEvent(registration.EventKind.DEREGISTER, info))

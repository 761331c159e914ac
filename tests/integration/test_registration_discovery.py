"""Discovery: the registry watcher against real sockets, good and bad."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubelet_dra import clock, settings
from kubelet_dra.plugin import getinfo, registration
from kubelet_dra.testing import eventually, fakedriver

from ._driver_fixtures import Events, make_settings

OBSERVER, OWNER = settings.Role.OBSERVER, settings.Role.OWNER


@contextlib.asynccontextmanager
async def watching(
    registry: pathlib.Path,
    *,
    role: settings.Role = OBSERVER,
    clk: clock.Clock | None = None,
    static: tuple[getinfo.PluginInfo, ...] = (),
    **overrides: Any,
) -> AsyncIterator[tuple[registration.RegistryWatcher, Events]]:
    events = Events()
    watcher = registration.RegistryWatcher(
        registry,
        role=role,
        settings=make_settings(**overrides),
        clock=clk or clock.SystemClock(),
        on_event=events,
        static=static,
    )
    async with watcher:
        yield watcher, events


def bound_socket(path: str | bytes, *, listen: bool = False) -> socket.socket:
    """A unix socket file with no gRPC server behind it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    if listen:
        sock.listen()
    return sock


async def test_existing_socket_at_start_registers_as_observer_without_notifying(
    registry: pathlib.Path,
) -> None:
    async with fakedriver.FakeDriver(registry=registry, health_versions=("v1alpha1",)) as drv:
        async with watching(registry) as (watcher, events):
            assert events.kinds() == ["register"]  # found by the initial scan
            info = events.events[0].plugin
            assert (info.driver, info.endpoint, info.socket) == (
                drv.name,
                str(drv.dra_socket),
                str(drv.registration_socket),
            )
            assert (info.dra_service, info.health_service) == (
                "v1.DRAPlugin",
                "v1alpha1.DRAResourceHealth",
            )
            assert watcher.registered == {str(drv.registration_socket): info}
        assert drv.calls["NotifyRegistrationStatus"] == 0


async def test_owner_notifies_registration_once(registry: pathlib.Path) -> None:
    first = fakedriver.FakeDriver(registry=registry)
    async with first as drv, watching(registry, role=OWNER) as (watcher, events):
        # Present at start: registered and notified before the watcher's start returned.
        assert drv.notifications == [(True, "")]
        for _ in range(3):
            await watcher.scan_once()  # rescans of an unchanged socket tell it nothing new
        # A later registration is the end of the period watched: the first driver's entry
        # comes first in every scan, so a repeat registration of it would have been
        # started, and seen, before the second driver's.
        async with fakedriver.FakeDriver(registry=registry, name="nic.example.com") as later:
            await eventually(
                lambda: later.notifications and events.kinds("nic.example.com"),
                what="the later driver's notification and registration",
            )
            assert drv.notifications == [(True, "")]
            assert drv.calls["GetInfo"] == 1
            assert events.kinds(drv.name) == ["register"]
            assert later.notifications == [(True, "")]


async def test_new_removed_and_recreated_sockets(registry: pathlib.Path) -> None:
    async with watching(registry) as (_, events):
        drv = fakedriver.FakeDriver(registry=registry / "nested")  # recursive watch
        await drv.start()
        await eventually(lambda: events.kinds() == ["register"], timeout=1.0)
        await drv.restart()  # same path, new inode
        await eventually(
            lambda: events.kinds() == ["register", "deregister", "register"], timeout=1.0
        )
        await drv.stop()
        await eventually(lambda: events.kinds()[-1] == "deregister", timeout=1.0)
        assert len(events.events) == 4


async def test_empty_endpoint_means_the_registration_socket(registry: pathlib.Path) -> None:
    driver = fakedriver.FakeDriver(registry=registry, empty_endpoint=True)
    async with driver as drv, watching(registry) as (_, events):
        assert events.events[0].plugin.endpoint == str(drv.registration_socket)


async def test_hidden_and_non_socket_files_are_ignored(registry: pathlib.Path) -> None:
    (registry / "notes.txt").write_text("not a socket")
    hidden = bound_socket(str(registry / ".hidden.sock"), listen=True)
    try:
        async with watching(registry) as (watcher, events):
            await watcher.scan_once()
            assert events.events == []
            assert watcher.failures == {}
    finally:
        hidden.close()


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"plugin_type": "CSIPlugin"}, "plugin type 'CSIPlugin' is not 'DRAPlugin'"),
        ({"supported_versions": []}, "empty list of supported gRPC services"),
        ({"supported_versions": ["v1.DRAResourceHealth"]}, "none of the supported gRPC"),
        # kubelet v1.38 validation of the name and the endpoint.
        ({"name": "gpu_example.com"}, "invalid DRA driver name 'gpu_example.com'"),
        ({"advertised_endpoint": "run/dra.sock"}, "must be an absolute path"),
        ({"advertised_endpoint": "/plugins/%2e%2e/evil.sock"}, "must be a plain path"),
        ({"advertised_endpoint": "/" + "x" * 107}, "must not be longer than 108 bytes"),
    ],
    ids=[
        "other-type",
        "empty-versions",
        "no-dra-service",
        "bad-name",
        "relative-endpoint",
        "percent-encoded-dotdot",
        "108-byte-endpoint",
    ],
)
async def test_invalid_plugins_are_refused_once_and_told_so_by_an_owner(
    registry: pathlib.Path, kwargs: dict[str, Any], reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake = clock.FakeClock()
    driver = fakedriver.FakeDriver(registry=registry, **kwargs)
    # A GetInfo timeout on a loaded machine would be a different (retried) failure.
    async with (
        driver as drv,
        watching(registry, role=OWNER, clk=fake, get_info_timeout=5.0) as (watcher, events),
    ):
        await eventually(lambda: str(drv.registration_socket) in watcher.failures)
        assert reason in watcher.failures[str(drv.registration_socket)]
        fake.advance(3600)
        for _ in range(5):
            await watcher.scan_once()
        assert drv.calls["GetInfo"] == 1  # parked: its answer will not change
        assert events.events == []
        assert drv.notifications[0][0] is False and reason in drv.notifications[0][1]
        assert sum(watcher.refused.values()) == 1  # counted once, by its reason
        # The watcher keeps serving: a good driver beside it registers.
        good = fakedriver.FakeDriver("good.example.com", registry=registry)
        async with good:
            await eventually(lambda: events.kinds() == ["register"])
            assert events.events[0].plugin.driver == "good.example.com"
    assert sum(reason in r.getMessage() for r in caplog.records) == 1


async def test_socket_without_server_is_retried_with_backoff_and_logged_once(
    registry: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = clock.FakeClock()
    path = str(registry / "dead-reg.sock")
    sock = bound_socket(path)  # bound, not listening: connection refused
    try:
        async with watching(registry, clk=fake) as (watcher, events):
            entry = watcher._sockets[path]
            assert entry.attempts == 1
            assert "GetInfo failed: UNAVAILABLE" in watcher.failures[path]
            for _ in range(3):  # no time passed: no new attempt
                await watcher.scan_once()
            assert entry.attempts == 1
            for attempts, step in ((2, 0.6), (3, 1.2), (4, 2.4), (5, 4.8)):  # 0.5 s doubling
                fake.advance(step)
                await eventually(lambda: entry.attempts == attempts)  # noqa: B023  # awaited here
            assert events.events == []
    finally:
        sock.close()
    assert sum("UNAVAILABLE" in r.getMessage() for r in caplog.records) == 1


async def test_hanging_get_info_times_out_without_blocking_other_drivers(
    registry: pathlib.Path,
) -> None:
    writers: list[asyncio.StreamWriter] = []

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)  # accepts, never answers (not even the HTTP/2 preface)

    hung_path = str(registry / "hung-reg.sock")
    server = await asyncio.start_unix_server(hang, hung_path)
    try:
        async with watching(registry) as (watcher, events):
            async with fakedriver.FakeDriver(registry=registry):
                await eventually(lambda: events.kinds() == ["register"], timeout=1.0)
            await eventually(lambda: hung_path in watcher.failures, timeout=2.0)
            assert "DEADLINE_EXCEEDED" in watcher.failures[hung_path]
    finally:
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_symlink_outside_registry_is_ignored(
    sockdir: pathlib.Path, registry: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with fakedriver.FakeDriver(registry=sockdir / "elsewhere") as drv:
        (registry / "link-reg.sock").symlink_to(drv.registration_socket)
        async with watching(registry) as (watcher, events):
            for _ in range(3):
                await watcher.scan_once()
            assert events.events == []
    messages = [r.getMessage() for r in caplog.records if "outside" in r.getMessage()]
    assert len(messages) == 1


async def test_symlink_inside_registry_to_a_known_socket_registers_once(
    registry: pathlib.Path,
) -> None:
    async with fakedriver.FakeDriver(registry=registry) as drv:
        (registry / "zz-link-reg.sock").symlink_to(drv.registration_socket)
        async with watching(registry) as (_, events):
            assert events.kinds() == ["register"]


async def test_name_that_is_not_utf8_is_ignored(
    registry: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    sock = bound_socket(os.fsencode(registry) + b"/bad-\xff.sock", listen=True)
    try:
        driver = fakedriver.FakeDriver(registry=registry)
        async with driver as drv, watching(registry) as (watcher, events):
            await watcher.scan_once()
            assert [e.plugin.driver for e in events.events] == [drv.name]
    finally:
        sock.close()
    assert sum("not valid UTF-8" in r.getMessage() for r in caplog.records) == 1


async def test_static_plugins_register_without_a_registry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    static = getinfo.make_plugin_info(
        "cpu.example.com", "/run/cpu/dra.sock", ["v1beta1.DRAPlugin", "v1.DRAResourceHealth"]
    )
    events = Events()
    watcher = registration.RegistryWatcher(
        None,
        role=OBSERVER,
        settings=make_settings(),
        clock=clock.SystemClock(),
        on_event=events,
        static=[static],
    )
    async with watcher:
        assert [e.plugin for e in events.events] == [static]
        assert static.health_service == "v1.DRAResourceHealth"

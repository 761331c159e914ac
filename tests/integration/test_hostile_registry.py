"""Hostile neighbours in the plugins registry (issue 22), with real sockets and a real FakeDriver.

- a socket that accepts a connection and never answers ``GetInfo``;
- 10,000 junk files and a symlink loop;
- a registration socket that is a symlink out of the registry.

Each must leave the real driver registered once with one stream, be logged
and be counted (``attempt_failures`` feeds
``kubelet_dra_registration_failures_total``, ``ignored`` the gauge
``kubelet_dra_registry_ignored_entries``). ~5 s in all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from kubelet_dra import clock, metrics
from kubelet_dra.plugin import plugins, registration
from kubelet_dra.state import healthinfo
from kubelet_dra.testing import eventually, fakedriver

from ._driver_fixtures import Changes, make_settings


@contextlib.contextmanager
def silent_server(path: pathlib.Path) -> Iterator[list[socket.socket]]:
    """A unix socket that accepts every connection, reads what comes and never writes."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.setblocking(False)  # the kernel buffers what the client sends
            accepted.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield accepted
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        for conn in accepted:
            conn.close()


@contextlib.asynccontextmanager
async def pipeline(
    registry: pathlib.Path, driver: fakedriver.FakeDriver
) -> AsyncIterator[tuple[registration.RegistryWatcher, plugins.PluginManager]]:
    # The sidecar's own poll interval: a scan of 10,000 entries costs 50 to 120 ms CPU.
    settings = make_settings(
        registry_poll_interval=0.5, registration_backoff_initial=0.2, registration_backoff_max=1.0
    )
    system = clock.SystemClock()
    cache = healthinfo.HealthCache()
    async with plugins.PluginManager(
        cache, settings=settings, clock=system, on_change=Changes()
    ) as mgr:
        await driver.set_health({"pool": "p", "device": "d", "health": "Healthy"})
        watcher = registration.RegistryWatcher(
            registry, role=settings.role, settings=settings, clock=system, on_event=mgr.handle
        )
        async with watcher:
            yield watcher, mgr


def _undisturbed(
    watcher: registration.RegistryWatcher, drv: fakedriver.FakeDriver, mgr: plugins.PluginManager
) -> None:
    assert list(watcher.registered) == [str(drv.registration_socket)]
    assert drv.calls["GetInfo"] == 1, drv.calls
    assert drv.calls["NodeWatchResources/v1"] == 1 and drv.open_streams == 1
    assert len(mgr.endpoints) == 1


def _exported(watcher: registration.RegistryWatcher, family: str, reason: str) -> float:
    state = metrics.State(
        registration_failures=dict(watcher.attempt_failures), registry_ignored=watcher.ignored
    )
    text = metrics.Metrics(lambda: state).render().decode()
    for line in text.splitlines():
        if line.startswith(f'{family}{{reason="{reason}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_socket_that_accepts_and_never_answers_getinfo_is_retried_and_counted(
    registry: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "kubelet_dra.plugin.registration")
    silent = registry / "silent.sock"
    with silent_server(silent) as accepted:
        async with (
            fakedriver.FakeDriver(registry=registry) as drv,
            pipeline(registry, drv) as (watcher, mgr),
        ):
            await drv.wait_for_streams(1)
            # Default get_info_timeout (1 s); backoff 0.2 s doubling to 1 s.
            await eventually(lambda: watcher.attempt_failures["DEADLINE_EXCEEDED"] >= 2, timeout=20)
            assert accepted, "the silent socket accepted no connection"
            assert "DEADLINE_EXCEEDED" in watcher.failures[str(silent)]
            _undisturbed(watcher, drv, mgr)
            total = "kubelet_dra_registration_failures_total"
            assert _exported(watcher, total, "DEADLINE_EXCEEDED") >= 2
    lines = [r.getMessage() for r in caplog.records if "silent.sock" in r.getMessage()]
    assert len(lines) == 1 and "GetInfo failed: DEADLINE_EXCEEDED" in lines[0], lines


async def test_ten_thousand_junk_files_and_a_symlink_loop_are_passed_over(
    registry: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "kubelet_dra.plugin.registration")
    junk = registry / "junk"
    junk.mkdir()
    for i in range(10_000):
        os.close(os.open(junk / f"j{i}.sock", os.O_CREAT | os.O_WRONLY, 0o600))
    (registry / "loop-a.sock").symlink_to(registry / "loop-b.sock")
    (registry / "loop-b.sock").symlink_to(registry / "loop-a.sock")
    (registry / "self").symlink_to(registry)  # a directory loop: links are not descended
    async with (
        fakedriver.FakeDriver(registry=registry) as drv,
        pipeline(registry, drv) as (watcher, mgr),
    ):
        await drv.wait_for_streams(1)
        started = time.process_time()
        await watcher.scan_once()
        scan = time.process_time() - started
        _undisturbed(watcher, drv, mgr)
        assert watcher.ignored["not_a_socket"] == 10_001  # the files and "self"
        assert watcher.ignored["symlink_loop"] == 2
        gauge = "kubelet_dra_registry_ignored_entries"
        assert _exported(watcher, gauge, "symlink_loop") == 2
        assert _exported(watcher, gauge, "not_a_socket") == 10_001
    messages = [r.getMessage() for r in caplog.records]
    assert sum("symlink loop" in m for m in messages) == 2  # once per link, not per scan
    assert any("10001 not_a_socket, 2 symlink_loop" in m for m in messages), messages
    print(f"\nregistry scan of 10,003 junk entries: {scan * 1000:.0f} ms CPU")


async def test_a_registration_socket_symlinked_from_outside_is_never_dialled(
    sockdir: pathlib.Path, registry: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "kubelet_dra.plugin.registration")
    outside = sockdir / "outside"
    outside.mkdir()
    async with (
        fakedriver.FakeDriver("other.example.com", registry=outside) as stranger,
        fakedriver.FakeDriver(registry=registry) as drv,
        pipeline(registry, drv) as (watcher, mgr),
    ):
        link = registry / "stranger.sock"
        link.symlink_to(stranger.registration_socket)
        await drv.wait_for_streams(1)
        for _ in range(3):
            await watcher.scan_once()
        await asyncio.sleep(0.3)  # what would dial it has had its chance
        assert stranger.calls["GetInfo"] == 0
        assert watcher.ignored["outside_registry"] == 1
        assert _exported(watcher, "kubelet_dra_registry_ignored_entries", "outside_registry") == 1
        _undisturbed(watcher, drv, mgr)
    lines = [r.getMessage() for r in caplog.records if "stranger.sock" in r.getMessage()]
    assert len(lines) == 1 and "outside the registry" in lines[0], lines

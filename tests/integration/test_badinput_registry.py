"""Registry junk: thousands of files and sockets appearing and disappearing next to a driver.

A real FakeDriver streams through a RegistryWatcher and a PluginManager while
waves of junk come and go in the registry: regular files, dead sockets (bound
then closed: connection refused), sockets that listen but never answer
(GetInfo times out), FIFOs, nested directories, dangling symlinks, symlinks
to the driver's own socket and names that are not UTF-8. The driver must stay
registered exactly once with one stream, and once the junk is gone the
watcher must hold nothing but the driver and no task or fd may be left.

Short version: 2 waves of 1000 items; long (``-m slow``): 10 waves of 5000.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import random
import shutil
import socket
import time

import pytest

from kubelet_dra import clock
from kubelet_dra.plugin import plugins, registration
from kubelet_dra.state import healthinfo
from kubelet_dra.testing import eventually, fakedriver

from ._driver_fixtures import Changes, make_settings


def _junk(
    directory: pathlib.Path, count: int, rng: random.Random, real: pathlib.Path
) -> list[socket.socket]:
    """Create ``count`` junk entries; returns the listening sockets to close later."""
    directory.mkdir()
    nested = directory / "a" / "b" / "c"
    nested.mkdir(parents=True)
    listening: list[socket.socket] = []
    for i in range(count):
        kind = rng.choice(
            ["file", "dead", "dead", "fifo", "nested", "dangling", "alias", "bytes", "listen"]
        )
        path = directory / f"j{i}.sock"
        if kind == "file":
            path.write_bytes(b"not a socket")
        elif kind == "dead":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(path))
            sock.close()
        elif kind == "listen" and len(listening) < 20:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(path))
            sock.listen(1)  # accepts into the backlog, never answers: GetInfo times out
            listening.append(sock)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "nested":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(nested / f"n{i}.sock"))
            sock.close()
        elif kind == "dangling":
            path.symlink_to(directory / "nowhere")
        elif kind == "alias":
            path.symlink_to(real)
        else:
            os.close(os.open(os.fsencode(directory) + b"/\xff\xfe%d.sock" % i, os.O_CREAT, 0o600))
    return listening


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize(
    ("waves", "count"),
    [
        pytest.param(2, 1000, id="short"),
        pytest.param(10, 5000, id="long", marks=[pytest.mark.slow, pytest.mark.timeout(900)]),
    ],
)
async def test_junk_waves_do_not_disturb_a_registered_driver(
    registry: pathlib.Path, waves: int, count: int
) -> None:
    rng = random.Random(count)
    cache = healthinfo.HealthCache()
    # The sidecar's own backoff (0.5 s doubling to 120 s): junk costs little once tried.
    settings = make_settings(registration_backoff_initial=0.5, registration_backoff_max=120.0)
    system = clock.SystemClock()
    async with (
        fakedriver.FakeDriver(registry=registry) as drv,
        plugins.PluginManager(cache, settings=settings, clock=system, on_change=Changes()) as mgr,
    ):
        await drv.set_health({"pool": "p", "device": "d", "health": "Healthy"}, resend=0.2)
        watcher = registration.RegistryWatcher(
            registry, role=settings.role, settings=settings, clock=system, on_event=mgr.handle
        )
        async with watcher:
            await drv.wait_for_streams(1)
            tasks, fds = len(asyncio.all_tasks()), _fds()
            started = time.monotonic()
            for wave in range(waves):
                junk = registry / f"junk{wave}"
                listening = _junk(junk, count, rng, drv.registration_socket)
                await eventually(lambda: len(watcher._sockets) > count // 5, timeout=30)
                await eventually(lambda: _all_tried(watcher), timeout=30)
                for sock in listening:
                    sock.close()
                shutil.rmtree(junk)
                await eventually(lambda: len(watcher._sockets) == 1, timeout=30)
            elapsed = time.monotonic() - started
            assert list(watcher.registered) == [str(drv.registration_socket)]
            assert drv.calls["GetInfo"] == 1, drv.calls
            assert drv.calls["NodeWatchResources/v1"] == 1 and drv.open_streams == 1
            assert len(mgr.endpoints) == 1 and not watcher.failures
            # +2: the lease-deadline task's two waiters come and go with each report.
            await eventually(lambda: len(asyncio.all_tasks()) <= tasks + 2, timeout=10)
            await eventually(lambda: _fds() <= fds, timeout=10)
    print(
        f"\nregistry junk: {waves} waves x {count} entries in {elapsed:.1f} s; driver undisturbed"
    )


def _all_tried(watcher: registration.RegistryWatcher) -> bool:
    return all(s.info or s.attempts or s.parked for s in watcher._sockets.values())


async def test_symlinks_to_a_registered_socket_never_take_its_place(registry: pathlib.Path) -> None:
    """Regression: a link scanned before the socket it points to deregistered the driver."""
    settings = make_settings()
    system = clock.SystemClock()
    cache = healthinfo.HealthCache()
    async with (
        fakedriver.FakeDriver(registry=registry) as drv,
        plugins.PluginManager(cache, settings=settings, clock=system, on_change=Changes()) as mgr,
    ):
        watcher = registration.RegistryWatcher(
            registry, role=settings.role, settings=settings, clock=system, on_event=mgr.handle
        )
        async with watcher:
            await drv.wait_for_streams(1)
            # Directory order is the filesystem's: with 30 directories some are
            # listed before the driver's socket.
            for i in range(30):
                (registry / f"d{i}").mkdir()
                (registry / f"d{i}" / "alias.sock").symlink_to(drv.registration_socket)
            for _ in range(5):
                await watcher.scan_once()
            assert list(watcher.registered) == [str(drv.registration_socket)]
            assert drv.calls["GetInfo"] == 1 and drv.calls["NodeWatchResources/v1"] == 1


@pytest.mark.parametrize("outside_link", [False, True], ids=["plain", "outside-link"])
async def test_watcher_close_returns_after_a_registration(
    sockdir: pathlib.Path, registry: pathlib.Path, outside_link: bool
) -> None:
    """Regression: asyncio.wait_for swallowed close()'s cancellation and it never returned."""
    settings = make_settings()
    events: list[registration.PluginEvent] = []

    async def on_event(event: registration.PluginEvent) -> None:
        events.append(event)

    async with fakedriver.FakeDriver(registry=registry) as drv:
        if outside_link:
            (registry / "link.sock").symlink_to(sockdir / "elsewhere.sock")
        watcher = registration.RegistryWatcher(
            registry, role=settings.role, settings=settings, clock=clock.SystemClock(),
            on_event=on_event,
        )  # fmt: skip
        await watcher.start()
        await drv.wait_for_calls("GetInfo")
        async with asyncio.timeout(5):
            await watcher.close()
    assert [e.kind for e in events] == [registration.EventKind.REGISTER]

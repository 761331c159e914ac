"""Disk faults under a live pipeline: read-only state dir, full disk, the file deleted.

In process: FakeDriver -> DRAHealthManager -> FakeApiServer. In every case
pods keep getting exact health from memory, the pipeline says it is degraded
(log, ``kubelet_dra_store_degraded``, ``/readyz`` detail) while it cannot
persist, and the state file holds every record again once it can.

A read-only and a full disk are real: a small tmpfs mounted on the state
directory (``mount -t tmpfs -o size=...``, remounted ``ro`` for read-only),
unmounted at the end and, through a watchdog, also when the test process
dies (see ``_Tmpfs``). That needs root. Without root the read-only case uses
a 0500 directory and the full-disk case is skipped; root without the right
to mount skips both with the mount's error.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import random
import shutil
from collections.abc import Iterator

import pytest

from kubelet_dra import manager, metrics
from kubelet_dra.state import store
from kubelet_dra.testing import FakeApiServer, FakeDriver, eventually

from . import _faults as fx
from ._tmpfs import NotPermitted as _NotPermitted
from ._tmpfs import Tmpfs as _Tmpfs

PODS = 4


@contextlib.contextmanager
def _tmpfs(path: pathlib.Path, size: str) -> Iterator[_Tmpfs | None]:
    """A tmpfs of ``size`` at ``path``; ``None`` when not root (no mount rights)."""
    if os.geteuid() != 0:
        yield None
        return
    try:
        mount = _Tmpfs(path, size)
    except (_NotPermitted, OSError) as exc:
        # Root without the right to mount (a container without CAP_SYS_ADMIN):
        # a 0500 directory stops no root, so skip, with the mount's own words.
        pytest.skip(f"root, but mounting a tmpfs failed: {exc}")
    try:
        yield mount
    finally:
        mount.close()


def _degraded_metric(mgr: manager.DRAHealthManager) -> float:
    text = metrics.Metrics(mgr.metric_state).render().decode()
    line = next(x for x in text.splitlines() if x.startswith("kubelet_dra_store_degraded "))
    return float(line.split()[1])


def _stored(state_dir: pathlib.Path) -> dict[str, tuple[str, str]]:
    db = store.HealthStore.open(state_dir)
    try:
        assert db.moved_aside is None
        return {k.device: (r.health.value, r.message) for k, r in db.load()}
    finally:
        db.close()


def _reported(world: fx.World) -> dict[str, tuple[str, str]]:
    return {f"gpu-{i}": hm for i, hm in world.health.items()}


def _world(api: FakeApiServer, seed: int, devices: int = PODS) -> fx.World:
    world = fx.World(devices, random.Random(seed))
    for i in range(PODS):
        fx.add_pod(api, f"pod-{i}", i)
        world.pods[f"pod-{i}"] = i
    return world


async def test_read_only_state_dir_at_start_serves_from_memory_then_persists(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    world = _world(api, 1)
    with _tmpfs(sockdir / "state", "1m") as mounted:
        state = sockdir / "state"
        cfg = fx.manager_settings(sockdir, api, state_dir=state)
        async with FakeDriver(name=fx.DRIVER, registry=sockdir / "reg") as driver:
            await driver.set_health(*world.reports())
            async with manager.DRAHealthManager(cfg):
                await eventually(lambda: world.converged(api), what="first convergence", timeout=15)
            before = _stored(state)
            if mounted:
                mounted.remount("ro")
            else:
                state.chmod(0o500)
            try:
                async with manager.DRAHealthManager(cfg) as mgr:
                    assert mgr.store is not None and mgr.store.degraded
                    loaded = len(mgr.cache)
                    assert loaded == len(before), "records not read back from the read-only file"
                    assert mgr.readiness()["store"].startswith("degraded, serving from memory")
                    assert _degraded_metric(mgr) == 1.0
                    world.mutate(PODS)
                    await driver.set_health(*world.reports())
                    await eventually(
                        lambda: world.converged(api), what="served from memory", timeout=15
                    )
                    if mounted:
                        mounted.remount("rw")
                    else:
                        state.chmod(0o700)
                    await eventually(
                        lambda: mgr.readiness()["store"] == "ok", what="writable again", timeout=10
                    )
                    assert _degraded_metric(mgr) == 0.0
            finally:
                if not mounted:
                    state.chmod(0o700)
            assert _stored(state) == _reported(world)
    print(
        f"\nread-only state dir ({'tmpfs ro' if mounted else 'chmod 0500'}): {len(before)} "
        f"records on disk, {loaded} read back read-only, pods exact while degraded, "
        "persisted after it was writable again"
    )


async def test_disk_full_serves_from_memory_says_so_and_persists_when_space_returns(
    sockdir: pathlib.Path, api: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    devices = 60
    world = _world(api, 2, devices)
    with _tmpfs(sockdir / "state", "512k") as mounted:
        if not mounted:
            pytest.skip("not root: a full disk needs a small tmpfs, which only root can mount")
        state = sockdir / "state"
        cfg = fx.manager_settings(sockdir, api, state_dir=state)
        filler = state / "filler"
        async with (
            FakeDriver(name=fx.DRIVER, registry=sockdir / "reg") as driver,
            manager.DRAHealthManager(cfg) as mgr,
        ):
            await driver.set_health(*world.reports())
            await eventually(lambda: world.converged(api), what="first convergence", timeout=15)
            _fill(filler)
            assert mgr.store is not None
            db = mgr.store  # the manager's store object lives as long as the manager
            rounds = 0
            while not db.degraded:
                rounds += 1
                assert rounds < 200, "the disk never filled up"
                world.health = {i: ("Unhealthy", f"{rounds} " + "✗" * 300) for i in range(devices)}
                await driver.set_health(*world.reports())
                await eventually(lambda: db.pending == 0 or db.degraded, timeout=5)
            await eventually(
                lambda: "cannot write health cache" in caplog.text, what="the error log", timeout=5
            )
            assert mgr.readiness()["store"].startswith("degraded, serving from memory")
            assert _degraded_metric(mgr) == 1.0
            world.mutate(PODS)
            await driver.set_health(*world.reports())
            await eventually(lambda: world.converged(api), what="served from memory", timeout=15)
            filler.unlink()
            await eventually(lambda: not db.degraded, what="space again", timeout=10)
            await eventually(
                lambda: "writable again" in caplog.text, what="the recovery log", timeout=5
            )
            errors = mgr.store_errors
        assert _stored(state) == _reported(world)
    print(
        f"\ndisk full: filled after {rounds} rounds, {errors} failed flushes, pods exact, "
        "persisted after space returned"
    )


def _fill(filler: pathlib.Path) -> None:
    with filler.open("wb", buffering=0) as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 4096)


@pytest.mark.parametrize("what", ["file", "file-wal-shm", "directory"])
async def test_cache_file_deleted_under_the_process_is_noticed_and_written_again(
    sockdir: pathlib.Path, api: FakeApiServer, caplog: pytest.LogCaptureFixture, what: str
) -> None:
    state = sockdir / "state"
    world = _world(api, 3)
    caplog.set_level(logging.INFO)
    async with fx.converged(api, sockdir, world) as (driver, mgr):
        await eventually(lambda: mgr.store is not None and mgr.store.pending == 0, timeout=5)
        if what == "directory":
            shutil.rmtree(state)
        else:
            for suffix in ("", "-wal", "-shm") if what == "file-wal-shm" else ("",):
                (state / f"{store.FILE_NAME}{suffix}").unlink(missing_ok=True)
        await eventually(
            lambda: "was deleted or replaced" in caplog.text, what="noticed", timeout=5
        )
        await eventually(
            lambda: (state / store.FILE_NAME).exists() and mgr.readiness()["store"] == "ok",
            timeout=5,
        )
        assert mgr.store_errors >= 1
        world.mutate(PODS)
        await driver.set_health(*world.reports())
        await eventually(lambda: world.converged(api), what="pods after deletion", timeout=15)
        await eventually(lambda: mgr.store is not None and mgr.store.pending == 0, timeout=5)
        assert _stored(state) == _reported(world)
    assert _stored(state) == _reported(world)


async def test_state_dir_replaced_by_a_file_reports_degraded_until_it_is_back(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    state = sockdir / "state"
    world = _world(api, 4)
    async with fx.converged(api, sockdir, world) as (driver, mgr):
        shutil.rmtree(state)
        state.write_text("not a directory")
        await eventually(lambda: mgr.readiness()["store"] != "ok", what="degraded", timeout=5)
        detail = mgr.readiness()["store"]
        assert detail.startswith("degraded, serving from memory"), detail
        assert _degraded_metric(mgr) == 1.0
        world.mutate(PODS)
        await driver.set_health(*world.reports())
        await eventually(lambda: world.converged(api), what="served from memory", timeout=15)
        state.unlink()
        await eventually(
            lambda: mgr.readiness()["store"] == "ok", what="persisting again", timeout=10
        )
        await eventually(lambda: mgr.store is not None and mgr.store.pending == 0, timeout=5)
    assert _stored(state) == _reported(world)
    print(f"\nstate dir replaced by a file: /readyz said {detail!r}; persisted after it was back")

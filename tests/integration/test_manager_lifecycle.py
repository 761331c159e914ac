"""The manager's objects are built once: what a caller takes before ``start`` stays live.

Real state file (SQLite), real gRPC to a ``FakeDriver``, node-agent mode (no API).
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import sqlite3
import threading
import time

from kubelet_dra import manager, models
from kubelet_dra.state import store
from kubelet_dra.testing import FakeDriver, eventually

from ._driver_fixtures import make_settings

DRIVER = "gpu.example.com"


def _seed(state_dir: pathlib.Path, key: models.DeviceKey, now: float) -> None:
    """A state file holding one Unhealthy device whose lease is far from over."""
    db = store.HealthStore.open(state_dir)
    db.stage(key, models.DeviceHealth(models.HealthStatus.UNHEALTHY, "XID 79", now, 3600.0))
    db.flush()
    db.close()


async def test_cache_taken_before_start_is_the_live_one(sockdir: pathlib.Path) -> None:
    (sockdir / "reg").mkdir()
    cfg = make_settings(sockdir=sockdir, store_flush_interval=0.02, startup_grace=0.0)
    loaded = models.DeviceKey(DRIVER, "pool", "gpu-9")
    reported = models.DeviceKey(DRIVER, "pool", "gpu-0")
    mgr = manager.DRAHealthManager(cfg, on_status=lambda update: None)
    early_cache, early_plugins = mgr.cache, mgr.plugins
    _seed(cfg.state_dir, loaded, time.time())
    async with FakeDriver(DRIVER, registry=sockdir / "reg") as driver:
        await driver.set_health({"pool": "pool", "device": "gpu-0", "health": "Healthy"})
        async with mgr:
            assert mgr.cache is early_cache and mgr.plugins is early_plugins
            # The state file was loaded into the cache the caller already held ...
            assert early_cache.get(loaded, time.time()).health is models.HealthStatus.UNHEALTHY
            # ... the streams feed it ...
            await eventually(
                lambda: early_cache.get(reported, time.time()).health is models.HealthStatus.HEALTHY
            )
    # The report reached the state file that was opened after the cache was built.
    db = store.HealthStore.open(cfg.state_dir)
    try:
        records = dict(db.load())
    finally:
        db.close()
    assert records[reported].health is models.HealthStatus.HEALTHY
    assert records[loaded].health is models.HealthStatus.UNHEALTHY


async def test_the_state_file_commits_while_the_default_thread_pool_is_busy(
    sockdir: pathlib.Path,
) -> None:
    # The API calls (pod lists, claim reads, the taint bridge) run on the event
    # loop's default pool; a commit queued behind them came 5-8 s late under load,
    # so a device kept less than half its lease across a crash. The store has a
    # thread of its own: with every default worker blocked, a report still reaches
    # the file.
    (sockdir / "reg").mkdir()
    cfg = make_settings(sockdir=sockdir, store_flush_interval=0.02, startup_grace=0.0)
    key = models.DeviceKey(DRIVER, "pool", "gpu-0")
    release = threading.Event()
    loop = asyncio.get_running_loop()
    async with (
        FakeDriver(DRIVER, registry=sockdir / "reg") as driver,
        manager.DRAHealthManager(cfg, on_status=lambda update: None) as mgr,
    ):
        await eventually(lambda: mgr.plugins.endpoints, what="the driver registered")
        # More blockers than the default pool has workers (min(32, cpus + 4)).
        blocked = [loop.run_in_executor(None, release.wait) for _ in range(40)]
        try:
            await driver.set_health(
                {"pool": "pool", "device": "gpu-0", "health": "Unhealthy", "message": "XID 79"}
            )
            await eventually(
                lambda: _stored_health(cfg.state_dir, key) == "Unhealthy",
                what="the report committed to the state file",
                timeout=10,
            )
        finally:
            release.set()
            await asyncio.gather(*blocked)


def _stored_health(state_dir: pathlib.Path, key: models.DeviceKey) -> str | None:
    # Read the file directly (not through the store, nor on a thread of the pool).
    uri = (state_dir / store.FILE_NAME).absolute().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        for (value,) in conn.execute('SELECT value FROM "devices"'):
            record = json.loads(value)
            if (record["driver"], record["pool"], record["device"]) == tuple(key):
                return str(record["health"])
        return None
    finally:
        conn.close()

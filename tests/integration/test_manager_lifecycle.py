"""The manager's objects are built once: what a caller takes before ``start`` stays live.

Real state file (SQLite), real gRPC to a ``FakeDriver``, node-agent mode (no API).
"""

from __future__ import annotations

import pathlib
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

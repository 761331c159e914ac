"""The whole pipeline in one process: FakeDriver -> DRAHealthManager -> FakeApiServer.

Real gRPC over unix sockets, a real SQLite state file, and the official
kubernetes client talking HTTP to the API stand-in.
"""

from __future__ import annotations

import asyncio
import pathlib
import time
from typing import Any

from kubelet_dra import manager, models, settings
from kubelet_dra.status import podstatus
from kubelet_dra.testing import FakeApiServer, FakeDriver, eventually, make_pod

from ._driver_fixtures import PIPELINE, make_settings
from ._sidecar_process import DRIVER, NODE, cluster, pod_health, settings_for


def config(sockdir: pathlib.Path, api: FakeApiServer, **extra: Any) -> settings.Settings:
    return settings_for(sockdir, api, **{"stream_backoff_initial": 1.0, **extra})


def condition(api: FakeApiServer, name: str) -> dict[str, Any] | None:
    status = api.get_pod("default", name)["status"]
    return podstatus.find_condition(status, "DeviceHealthy")


async def test_health_reaches_pod_status_condition_and_state_file(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    cluster(api)
    cfg = config(sockdir, api)
    async with FakeDriver(name=DRIVER, registry=sockdir / "reg") as driver:
        await driver.set_health(
            {"pool": "pool", "device": "gpu-0", "health": "Healthy"},
            {"pool": "pool", "device": "gpu-1", "health": "Healthy"},
        )
        async with manager.DRAHealthManager(cfg) as mgr:
            await eventually(
                lambda: pod_health(api, "train-a") == {f"{DRIVER}/pool/gpu-0": ("Healthy", "")}
            )
            await driver.set_health(
                {"pool": "pool", "device": "gpu-0", "health": "Unhealthy", "message": "XID 79"},
                {"pool": "pool", "device": "gpu-1", "health": "Healthy"},
            )
            await eventually(
                lambda: (
                    pod_health(api, "train-a")[f"{DRIVER}/pool/gpu-0"] == ("Unhealthy", "XID 79")
                )
            )
            cond = condition(api, "train-a")
            assert cond is not None and cond["status"] == "False"
            assert "gpu-0" in cond["message"]
            assert pod_health(api, "train-b") == {f"{DRIVER}/pool/gpu-1": ("Healthy", "")}
            assert mgr.readiness() == {"store": "ok", "pods": "ok", "claims": "ok"}
    # The pod on another node is never written.
    assert not api.status_writes("default", "elsewhere")
    # The state file kept the last report, and shutdown did not mark it Unknown.
    from kubelet_dra.state import store

    db = store.HealthStore.open(cfg.state_dir)
    records = dict(db.load())
    db.close()
    assert (
        records[models.DeviceKey(DRIVER, "pool", "gpu-0")].health is models.HealthStatus.UNHEALTHY
    )


async def test_driver_death_keeps_health_for_the_lease_then_unknown_and_recovery_heals(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    cluster(api)
    cfg = config(sockdir, api, stream_backoff_initial=0.05, stream_backoff_max=0.2)
    gpu0 = f"{DRIVER}/pool/gpu-0"
    async with FakeDriver(name=DRIVER, registry=sockdir / "reg") as driver:
        unhealthy = {"pool": "pool", "device": "gpu-0", "health": "Unhealthy", "message": "XID 79"}
        await driver.set_health({**unhealthy, "timeout_seconds": 2}, resend=0.2)
        async with manager.DRAHealthManager(cfg):
            await eventually(
                lambda: pod_health(api, "train-a").get(gpu0) == ("Unhealthy", "XID 79")
            )
            await driver.stop()
            stopped = time.monotonic()
            await eventually(lambda: pod_health(api, "train-a")[gpu0][0] == "Unknown", timeout=10)
            # Not at the stream end: when the 2 s lease renewed at most 0.2 s
            # before the stop ran out (a lower bound only: load makes it later).
            assert time.monotonic() - stopped >= 1.5
            await driver.start()
            await driver.set_health({"pool": "pool", "device": "gpu-0", "health": "Healthy"})
            await eventually(
                lambda: pod_health(api, "train-a")[gpu0][0] == "Healthy",
                timeout=10,
            )


async def test_driver_restart_within_the_lease_writes_no_pod(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    # A DaemonSet update without surge: the driver is killed and back on the
    # same socket paths within seconds. No Unknown, no write at all.
    cluster(api)
    cfg = config(sockdir, api, stream_backoff_initial=0.05, stream_backoff_max=0.2)
    gpu0 = f"{DRIVER}/pool/gpu-0"
    async with FakeDriver(name=DRIVER, registry=sockdir / "reg") as driver:
        await driver.set_health(
            {"pool": "pool", "device": "gpu-0", "health": "Unhealthy", "message": "XID 79"}
        )
        async with manager.DRAHealthManager(cfg) as mgr:
            await eventually(
                lambda: pod_health(api, "train-a").get(gpu0) == ("Unhealthy", "XID 79")
            )
            await eventually(lambda: condition(api, "train-a") is not None)
            writes = len(api.status_writes("default", "train-a"))
            reports = mgr.plugins.drivers[DRIVER].reports
            await driver.restart()
            await eventually(lambda: mgr.plugins.drivers[DRIVER].reports > reports, timeout=10)
            await asyncio.sleep(0.3)  # a window for a wrong write to show up
            assert len(api.status_writes("default", "train-a")) == writes
            assert pod_health(api, "train-a")[gpu0] == ("Unhealthy", "XID 79")


async def test_node_agent_callback_receives_desired_status(sockdir: pathlib.Path) -> None:
    from kubelet_dra.status import claims

    updates: list[manager.PodHealthUpdate] = []
    cfg = make_settings(tuning=PIPELINE, sockdir=sockdir, node_name=NODE)
    pod = make_pod("agent-pod", NODE, claims=["gpu"])
    pod["metadata"]["uid"] = "uid-1"
    async with (
        FakeDriver(name=DRIVER, registry=sockdir / "reg") as driver,
        manager.DRAHealthManager(cfg, on_status=updates.append) as mgr,
    ):
        mgr.index.add_prepared_claim(
            namespace="default",
            name="gpu",
            devices=[claims.PreparedDevice(DRIVER, "pool", "gpu-7", (), ("cdi.example/gpu=7",))],
            pod_uids=["uid-1"],
        )
        mgr.set_pod(pod)
        await driver.set_health({"pool": "pool", "device": "gpu-7", "health": "Unhealthy"})
        await eventually(
            lambda: any(
                d.health is models.HealthStatus.UNHEALTHY
                for u in updates
                for d in u.desired.devices
            )
        )
    last = updates[-1].desired
    assert last.pod_uid == "uid-1"
    [(field, container)] = last.containers
    entry = last.containers[(field, container)]["claim:gpu"]
    assert entry is not None
    assert entry["resources"] == [{"resourceID": "cdi.example/gpu=7", "health": "Unhealthy"}]

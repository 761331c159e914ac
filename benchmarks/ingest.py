"""Scenario 1, ingest: device updates per second from a real gRPC stream to a committed store.

The benchmark driver (a separate process) streams pre-encoded messages of 100
devices. The pipeline is :class:`kubelet_dra.manager.DRAHealthManager` in this
process (streams, conversion, health cache, claim index, batched store); the
clock stops when every update went through and the store has committed them.
The floor is a bare ``grpc.aio`` client reading the same stream from the same
driver, decoding and touching every field of every device. Both end states are
checked: the store and the bare client's map must hold the final sweep exactly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import time
from typing import Any

import grpc

from benchmarks import _common as c
from benchmarks import _driver
from kubelet_dra import manager, models, settings
from kubelet_dra._proto.dra_health.v1 import api_pb2 as pb
from kubelet_dra._proto.dra_health.v1 import api_pb2_grpc as pb_grpc
from kubelet_dra.plugin import getinfo

NAME = "ingest"
FINAL = 2


@dataclasses.dataclass(frozen=True)
class Config:
    sizes: tuple[tuple[int, int], ...]  # (devices, sweeps)
    runs: int


FULL = Config(sizes=((1_000, 200), (10_000, 20)), runs=5)
QUICK = Config(sizes=((1_000, 60), (10_000, 6)), runs=3)
SMOKE = Config(sizes=((1_000, 5),), runs=1)


def _expected(devices: int) -> dict[str, str]:
    return {c.device_name(i): _driver.pattern_health(i, FINAL) for i in range(devices)}


async def _pipeline_once(
    drv: c.DriverProcess, workdir: pathlib.Path, devices: int, sweeps: int, run: int
) -> float:
    cfg = settings.Settings(
        node_name=c.NODE,
        plugins_registry=workdir / "unused-registry",
        state_dir=workdir / f"state-{devices}-{run}",
    )
    plugin = getinfo.make_plugin_info(
        c.DRIVER, str(drv.dra_socket), ["v1.DRAPlugin", "v1.DRAResourceHealth"]
    )
    mgr = manager.DRAHealthManager(
        cfg, on_status=lambda update: None, static_plugins=[plugin], watch_registry=False
    )
    total = devices * sweeps
    streams = drv.streams
    async with mgr:
        await drv.wait_streams(streams + 1)
        started = time.perf_counter()
        await drv.send("sweeps", n=sweeps, final=FINAL)
        stats = mgr.plugins.drivers[c.DRIVER]
        await c.wait_until(
            lambda: stats.device_updates >= total, timeout=120, what="pipeline ingest"
        )
        assert mgr.store is not None
        await asyncio.to_thread(mgr.store.flush)
        elapsed = time.perf_counter() - started
        stored = {key.device: r for key, r in await asyncio.to_thread(mgr.store.load)}
    await drv.expect("sent")
    expected = _expected(devices)
    got = {name: r.health.value for name, r in stored.items()}
    if got != expected or stats.device_updates != total:
        raise c.CheckFailed(
            f"ingest {devices}: store holds {len(got)} devices, "
            f"{sum(1 for k, v in expected.items() if got.get(k) != v)} wrong, "
            f"{stats.device_updates} updates for {total} sent"
        )
    bad = [
        r for r in stored.values() if r.health is models.HealthStatus.UNHEALTHY and not r.message
    ]
    if bad:
        raise c.CheckFailed(f"ingest {devices}: {len(bad)} Unhealthy records lost their message")
    return total / elapsed


async def _floor_once(drv: c.DriverProcess, devices: int, sweeps: int) -> float:
    total = devices * sweeps
    seen: dict[tuple[str, str], tuple[Any, ...]] = {}
    count = 0
    streams = drv.streams
    async with grpc.aio.insecure_channel(f"unix:{drv.dra_socket}") as channel:
        call = pb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            pb.NodeWatchResourcesRequest()
        )
        await drv.wait_streams(streams + 1)
        started = time.perf_counter()
        await drv.send("sweeps", n=sweeps, final=FINAL)
        async for response in call:
            for d in response.devices:
                seen[(d.device.pool_name, d.device.device_name)] = (
                    d.health, d.message, d.health_check_timeout_seconds, d.last_updated_time,
                )  # fmt: skip
            count += len(response.devices)
            if count >= total:
                break
        elapsed = time.perf_counter() - started
        call.cancel()
    await drv.expect("sent")
    names = {"Healthy": 1, "Unhealthy": 2}
    expected = {name: names[h] for name, h in _expected(devices).items()}
    if {k[1]: v[0] for k, v in seen.items()} != expected:
        raise c.CheckFailed(f"ingest floor {devices}: the bare client's final state is wrong")
    return total / elapsed


async def run(config: Config) -> c.Outcome:
    out = c.Outcome(NAME)
    rows, summary_ratio = [], {}
    for devices, sweeps in config.sizes:
        with c.short_tmpdir() as workdir:
            drv = c.DriverProcess(workdir, devices=devices)
            async with drv:
                ours, floor = [], []
                for r in range(config.runs):
                    # Alternate the order so drift on a shared machine hits both.
                    if r % 2:
                        ours.append(await _pipeline_once(drv, workdir, devices, sweeps, r))
                        floor.append(await _floor_once(drv, devices, sweeps))
                    else:
                        floor.append(await _floor_once(drv, devices, sweeps))
                        ours.append(await _pipeline_once(drv, workdir, devices, sweeps, r))
        o, f = c.Spread.of(ours), c.Spread.of(floor)
        ratio = c.Spread.of(a / b for a, b in zip(ours, floor, strict=True))
        summary_ratio[devices] = (o, f, ratio)
        rows.append(
            (f"{devices:,}", f"{devices * sweeps:,}", o.fmt("/s"), f.fmt("/s"), ratio.fmt(" x", 2))
        )
    out.table(
        "Ingest: device updates/s, stream → cache → committed store (median [min-max])",
        ["devices", "updates per run", "pipeline", "floor: bare client", "pipeline / floor"],
        rows,
    )
    for devices, (o, f, ratio) in summary_ratio.items():
        out.summary.append(
            c.SummaryRow(
                f"1 ingest, {devices:,} devices",
                f"{c.num(o.median)} updates/s",
                f"{c.num(f.median)} /s (bare client)",
                f"{ratio.median:.0%}",
                "≥ 40 % of floor at 10,000" if devices >= 10_000 else "≥ 25 % of floor",
                ratio.median >= (0.40 if devices >= 10_000 else 0.25),
                value=ratio.median,
                better="higher",
            )
        )
    return out

"""Scenario 8, deadline accuracy: from each lease's deadline to the PATCH showing ``Unknown``.

A real sidecar process; the driver (:class:`kubelet_dra.testing.FakeDriver`) and
the API stand-in run in this process. The driver reports 110 pods x 8 devices
once, with ``health_check_timeout_seconds`` spread over a few values by pod, and
then stays silent with its stream open. Each device's deadline is exact: it is
``last_report + lease`` as the sidecar itself stored them, read from its state
file (plain ``sqlite3``, WAL allows a concurrent reader) before any lease runs
out. The delay of a device is the API stand-in's timestamp of the first status
write of its pod that shows it ``Unknown``, minus its deadline (both wall
clock). Every device must turn ``Unknown``. Leases are 4 s or longer and a
round starts with the writer's token bucket refilled: at 50 QPS the Healthy
wave of 110 pods alone takes about 2 s, and a group of pods whose leases run
out together is written within the burst. The kubelet shows such a device only
when something else rebuilds the pod's status.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
import sqlite3
import time

from benchmarks import _common as c
from kubelet_dra.testing import FakeApiServer, FakeDriver

NAME = "deadline"
PODS, PER_POD = 110, 8


@dataclasses.dataclass(frozen=True)
class Config:
    timeouts: tuple[int, ...]  # seconds; pod p gets timeouts[p % len]
    runs: int


# Leases start at 4 s: the Healthy wave itself (110 PATCHes at 50 QPS) takes about 2 s,
# and each deadline group (a fifth or a third of the pods) should fit in the refilled burst.
FULL = Config(timeouts=(4, 5, 6, 7, 8), runs=3)
QUICK = Config(timeouts=(4, 5, 6), runs=1)
SMOKE = Config(timeouts=(4,), runs=1)


def _deadlines(state_file: pathlib.Path) -> dict[str, float]:
    conn = sqlite3.connect(f"file:{state_file}?mode=ro", uri=True)
    try:
        rows = conn.execute('SELECT value FROM "devices"').fetchall()
    finally:
        conn.close()
    found = {}
    for (value,) in rows:
        record = json.loads(value)
        found[record["device"]] = float(record["last_report"]) + float(record["lease"])
    return found


def _shows(record: object, rid: str, health: str) -> bool:
    body = getattr(record, "body", None) or {}
    return c.written_health(body).get(rid) == health


async def _round(api: FakeApiServer, drv: FakeDriver, sidecar: c.SidecarProcess,
                 layout: dict[str, list[int]], config: Config) -> list[float]:  # fmt: skip
    devices = []
    for p in range(PODS):
        timeout = config.timeouts[p % len(config.timeouts)]
        devices += [
            {"pool": c.POOL, "device": c.device_name(d), "health": "Healthy",
             "timeout_seconds": timeout}
            for d in layout[f"pod-{p:04d}"]
        ]  # fmt: skip
    await asyncio.sleep(2.5)  # let the writer's token bucket refill (burst 100 at 50 QPS)
    sent = time.time()
    await drv.set_health(*devices)

    def healthy_written() -> bool:
        # Every pod was written Healthy once (short leases may run out before the last one is).
        seen = {
            r.path.rsplit("/", 2)[-2]
            for r in api.status_writes()
            if set(c.written_health(r.body).values()) == {"Healthy"}
        }
        return seen >= set(layout)

    await c.wait_until(healthy_written, timeout=30, what="every pod written Healthy", interval=0.02)
    state_file = sidecar.state_dir / "health.sqlite"
    names = {c.device_name(d) for ds in layout.values() for d in ds}

    def stored() -> dict[str, float]:
        got = _deadlines(state_file)
        return got if all(got.get(n, 0) > sent for n in names) else {}

    await c.wait_until(stored, timeout=5, what="the reports in the state file")
    deadlines = stored()
    if time.time() > min(deadlines.values()):
        raise c.CheckFailed("deadline: a lease ran out before the benchmark read the deadlines")
    await c.wait_until(
        lambda: c.pods_match(api, layout, lambda d: "Unknown"), timeout=max(config.timeouts) + 30,
        what="every device Unknown", interval=0.05,
    )  # fmt: skip
    delays = []
    writes = api.status_writes()
    for name, ds in layout.items():
        mine = [r for r in writes if r.path.endswith(f"/pods/{name}/status")]
        for d in ds:
            rid, deadline = c.resource_id(d), deadlines[c.device_name(d)]
            shown = [r.timestamp for r in mine if r.timestamp > sent and _shows(r, rid, "Unknown")]
            if not shown:
                raise c.CheckFailed(f"deadline: no PATCH showed {rid} Unknown")
            delays.append(min(shown) - deadline)
    api.reset_log()
    return delays


async def run(config: Config) -> c.Outcome:
    out = c.Outcome(NAME)
    with c.short_tmpdir() as workdir, c.api_server() as api:
        layout = c.build_cluster(api, pods=PODS, devices_per_pod=PER_POD)
        floor = c.Spread.of(c.patch_floor(api, 100))
        registry = workdir / "reg"
        async with FakeDriver(name=c.DRIVER, registry=registry) as drv:
            with c.SidecarProcess(workdir / "side", api, registry=registry) as sidecar:
                await sidecar.wait_ready(timeout=60)
                rounds = [
                    await _round(api, drv, sidecar, layout, config) for _ in range(config.runs)
                ]
    delays = [d for r in rounds for d in r]
    early = [d for d in delays if d < 0]
    out.check(not early, f"deadline: {len(early)} devices shown Unknown before their deadline")
    ms = 1000
    p50, p99 = c.percentile(delays, 50), c.percentile(delays, 99)
    per_round = c.Spread.of(c.percentile(r, 99) for r in rounds)
    out.table(
        f"Deadline accuracy: ms from a lease's deadline to the PATCH showing Unknown "
        f"({len(delays)} devices over {config.runs} rounds; leases {config.timeouts} s by pod)",
        ["measure", "p50", "p90", "p99", "max", "p99 per round"],
        [("floor: one raw PATCH", c.num(floor.median * ms), "", "", c.num(floor.high * ms), ""),
         ("sidecar (window 50 ms)", c.num(p50 * ms), c.num(c.percentile(delays, 90) * ms),
          c.num(p99 * ms), c.num(max(delays) * ms), per_round.fmt(" s"))],
    )  # fmt: skip
    out.summary.append(
        c.SummaryRow(
            "8 deadline accuracy",
            f"p50 {c.num(p50 * ms)} ms, p99 {c.num(p99 * ms)} ms",
            f"{c.num(floor.median * ms)} ms (raw PATCH)",
            f"{p99 / floor.median:.0f}x (p99)",
            "p99 < 100 ms",
            p99 < 0.100,
            value=p99 / floor.median,
            better="lower",
        )
    )
    return out

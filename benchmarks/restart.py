"""Scenario 5, restart: from exec to ``/readyz`` ready and to the first correct PATCH.

A state file with 10,000 or 100,000 devices (every third Unhealthy, leases an
hour long) is written with :class:`kubelet_dra.state.store.HealthStore`; each run
copies it into a fresh state directory and execs ``python -m kubelet_dra run``
against a fresh API stand-in holding 110 pods with 8 of those devices each and
no driver: what the pods must show comes from the file alone. Timed on the
wall clock from just before exec to the first 200 of ``/readyz`` (polled every
5 ms) and to the API stand-in logging the first PATCH that shows a pod's stored
health exactly; every pod must end up correct. The floor is exec to exit of a
Python that only imports grpc, kubernetes, sqlitedict and pydantic.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
import subprocess
import sys
import time

from benchmarks import _common as c
from benchmarks import _driver
from kubelet_dra import models
from kubelet_dra.state import store

NAME = "restart"
PODS, PER_POD, PATTERN = 110, 8, 1


@dataclasses.dataclass(frozen=True)
class Config:
    sizes: tuple[int, ...]
    runs: int
    runs_largest: int  # the 100,000-device file takes a while to write and load


FULL = Config(sizes=(10_000, 100_000), runs=5, runs_largest=3)
QUICK = Config(sizes=(10_000, 100_000), runs=2, runs_largest=1)
SMOKE = Config(sizes=(1_000,), runs=1, runs_largest=1)

IMPORTS = "import grpc, kubernetes.client, sqlitedict, pydantic"


def _write_state(state_dir: pathlib.Path, devices: int) -> None:
    db = store.HealthStore.open(state_dir)
    now = time.time()
    for i in range(devices):
        bad = _driver.pattern_health(i, PATTERN) == "Unhealthy"
        db.stage(
            models.DeviceKey(c.DRIVER, c.POOL, c.device_name(i)),
            models.DeviceHealth(
                health=models.HealthStatus.UNHEALTHY if bad else models.HealthStatus.HEALTHY,
                message="XID 79" if bad else "",
                lease=3600.0,
                last_report=now,
            ),
        )
    db.flush()
    db.close()


def _floor() -> float:
    started = time.time()
    subprocess.run([sys.executable, "-c", IMPORTS], check=True, env=c.quiet_env())
    return time.time() - started


async def _once(
    workdir: pathlib.Path, template: pathlib.Path, run: int
) -> tuple[float, float, float]:
    expected = lambda d: _driver.pattern_health(d, PATTERN)  # noqa: E731
    with c.api_server() as api:
        layout = c.build_cluster(api, pods=PODS, devices_per_pod=PER_POD)
        side = workdir / f"run-{run}"
        registry = side / "reg"
        registry.mkdir(parents=True)
        sidecar = c.SidecarProcess(side, api, registry=registry)
        shutil.copytree(template, sidecar.state_dir)
        with sidecar:
            ready = await sidecar.wait_ready(timeout=60)
            await c.wait_until(
                lambda: c.pods_match(api, layout, expected),
                timeout=60,
                what="pods from the file",
                interval=0.05,
            )
            writes = api.status_writes()
    good = []
    for r in writes:
        name = r.path.rsplit("/", 2)[-2]
        want = {c.resource_id(d): expected(d) for d in layout[name]}
        if c.written_health(r.body) == want:
            good.append(r.timestamp)
    if not good:
        raise c.CheckFailed("restart: no PATCH showed a pod's stored health")
    return ready - sidecar.exec_time, min(good) - sidecar.exec_time, max(good) - sidecar.exec_time


async def run(config: Config) -> c.Outcome:
    out = c.Outcome(NAME)
    floor = c.Spread.of(_floor() for _ in range(max(3, config.runs)))
    rows = [("floor: exec → exit, imports only", "", floor.fmt(" s"), "", "")]
    at = {}
    for devices in config.sizes:
        with c.short_tmpdir() as workdir:
            template = workdir / "template"
            _write_state(template, devices)
            count = config.runs_largest if devices > 10_000 else config.runs
            runs = [await _once(workdir, template, r) for r in range(count)]
        ready, first, last = (c.Spread.of(x[i] for x in runs) for i in range(3))
        at[devices] = ready, first
        rows.append((f"sidecar, {devices:,} devices in the file", ready.fmt(" s"), first.fmt(" s"),
                     last.fmt(" s"), f"{ready.median / floor.median:.1f} x"))  # fmt: skip
    out.table(
        f"Restart: seconds from exec (median [min-max] of {config.runs} runs, "
        f"{config.runs_largest} at 100,000; {PODS} pods)",
        [
            "process",
            "→ /readyz 200",
            "→ first correct PATCH",
            "→ last pod correct",
            "ready / floor",
        ],
        rows,
    )
    for devices, (ready, first) in at.items():
        target = devices == 10_000
        out.summary.append(
            c.SummaryRow(
                f"5 restart, {devices:,} devices",
                f"ready {ready.median:.2f} s, first PATCH {first.median:.2f} s",
                f"{floor.median:.2f} s (imports only)",
                f"{ready.median / floor.median:.1f}x",
                "ready ≤ 3x floor at 10,000" if target else "report",
                ready.median <= 3 * floor.median if target else None,
                value=ready.median / floor.median,
                better="lower",
            )
        )
    return out

"""Scenario 3, storm: 100,000 device reports in 10 s on 1,000 devices shared by 110 pods.

The benchmark driver (a process) paces reports of random devices with random
health (seeded, so this process knows the final state) in messages of 10
devices; the sidecar is a real process with its default writer settings
(window 50 ms, 50 QPS, burst 100). Checked: every pod ends showing exactly the
final health of its devices; the writes per pod stay within
``duration / window + 2``; the requests the API stand-in logged fit the token
bucket (never more than ``burst + qps * t`` in any interval ``t``) and their
sustained rate stays at or under the QPS. Reported: writes per pod and the time
from the driver's last report to the last status write (the last correct one).
"""

from __future__ import annotations

import asyncio
import dataclasses

from benchmarks import _common as c
from benchmarks import _driver

NAME = "storm"
PODS, DEVICES, PER_POD = 110, 1_000, 9
WINDOW, QPS, BURST = 0.05, 50.0, 100


@dataclasses.dataclass(frozen=True)
class Config:
    reports: int
    seconds: float
    runs: int


FULL = Config(reports=100_000, seconds=10.0, runs=3)
QUICK = Config(reports=20_000, seconds=2.0, runs=1)
SMOKE = Config(reports=2_000, seconds=1.0, runs=1)


def bucket_excess(stamps: list[float]) -> float:
    """Largest count - (burst + qps * span) over every interval of requests (≤ 0: fits)."""
    stamps = sorted(stamps)
    worst = float("-inf")
    for i in range(len(stamps)):
        for j in range(i, len(stamps)):
            worst = max(worst, (j - i + 1) - (BURST + QPS * (stamps[j] - stamps[i])))
    return worst


async def _once(config: Config, seed: int) -> dict[str, float]:
    with c.short_tmpdir() as workdir, c.api_server() as api:
        layout = c.build_cluster(
            api, pods=PODS, devices_per_pod=PER_POD, device_of=lambda p, k: p + PODS * k
        )
        async with c.DriverProcess(workdir, devices=DEVICES, chunk=100) as drv:
            with c.SidecarProcess(workdir / "side", api, registry=drv.registry):
                await drv.wait_streams(1)
                await drv.send("once", pattern=0)
                await c.wait_until(
                    lambda: c.pods_match(api, layout, lambda d: "Healthy"), timeout=60,
                    what="every pod Healthy before the storm", interval=0.05,
                )  # fmt: skip
                await asyncio.sleep(0.5)
                await drv.expect("sent")
                api.reset_log()
                rate = config.reports / config.seconds
                await drv.send(
                    "storm", reports=config.reports, per_message=10, rate=rate, seed=seed
                )
                sent = await drv.expect("sent", timeout=config.seconds * 10 + 60)
                final = _driver.storm_final(seed, config.reports, DEVICES)
                await c.wait_until(
                    lambda: c.pods_match(api, layout, final.__getitem__), timeout=120,
                    what="every pod showing the storm's final health", interval=0.05,
                )  # fmt: skip
                await asyncio.sleep(1.0)
                if not c.pods_match(api, layout, final.__getitem__):
                    raise c.CheckFailed("storm: a pod changed away from the final health")
                requests = [r for r in api.requests if not r.is_watch]
    writes = [r for r in requests if r.is_status_write]
    per_pod: dict[str, int] = {}
    for r in writes:
        per_pod[r.path] = per_pod.get(r.path, 0) + 1
    duration = sent["t"] - sent["first"]
    span = max(r.timestamp for r in requests) - min(r.timestamp for r in requests)
    return {
        "duration": duration,
        "max_writes": max(per_pod.values()),
        "mean_writes": sum(per_pod.values()) / PODS,
        "bound": duration / WINDOW + 2,
        "settle": max(r.timestamp for r in writes) - sent["t"],
        "requests": len(requests),
        # The bucket starts full: the burst is not part of the sustained rate.
        "rate": max(0, len(requests) - BURST) / span if span > 0 else 0.0,
        "excess": bucket_excess([r.timestamp for r in requests]),
        "pods_written": len(per_pod),
        "pods_changed": sum(1 for ds in layout.values() if any(final[d] != "Healthy" for d in ds)),
    }


async def run(config: Config) -> c.Outcome:
    out = c.Outcome(NAME)
    results = [await _once(config, seed=100 + r) for r in range(config.runs)]
    for res in results:
        out.check(
            res["max_writes"] <= res["bound"],
            f"storm: {res['max_writes']} writes to a pod, bound {res['bound']:.0f}",
        )
        out.check(
            res["excess"] <= 2, f"storm: requests exceeded the token bucket by {res['excess']:.1f}"
        )
        out.check(
            res["pods_written"] >= res["pods_changed"],
            f"storm: {res['pods_written']} pods written, {res['pods_changed']} changed",
        )

    def spread(key: str) -> c.Spread:
        return c.Spread.of(r[key] for r in results)

    out.table(
        f"Storm: {config.reports:,} reports over {config.seconds:g} s, {DEVICES:,} devices, "
        f"{PODS} pods; window {WINDOW * 1000:g} ms, {QPS:g} QPS, burst {BURST} "
        f"(median [min-max] of {config.runs} runs)",
        ["measure", "value", "limit"],
        [
            ("storm duration at the driver, s", spread("duration").fmt(), ""),
            ("status writes per pod, max", spread("max_writes").fmt(),
             f"≤ duration/window + 2 = {spread('bound').median:.0f}"),
            ("status writes per pod, mean", spread("mean_writes").fmt(), ""),
            ("API requests (writes + events)", spread("requests").fmt(), ""),
            ("sustained rate (requests - burst) / span, /s", spread("rate").fmt(), f"≤ {QPS:g}"),
            ("token-bucket excess (requests)", spread("excess").fmt(),
             "≤ 0 (2 of timestamp slack)"),
            ("last report → last correct status, s", spread("settle").fmt(), "report"),
        ],
    )  # fmt: skip
    settle, rate = spread("settle"), spread("rate")
    out.summary.append(
        c.SummaryRow(
            "3 storm, 110 pods",
            f"{spread('max_writes').median:.0f} writes/pod max; settles {settle.median:.2f} s "
            "after the last report",
            f"bound {spread('bound').median:.0f} writes/pod; {QPS:g} QPS",
            f"{rate.median / QPS:.2f}x QPS",
            "exact final state; writes ≤ bound; rate ≤ QPS",
            all(r["max_writes"] <= r["bound"] and r["excess"] <= 2 for r in results),
            value=rate.median / QPS,
            better="lower",
        )
    )
    return out

"""Scenario 7, API load per node: requests at start, at steady state and during a storm.

For 10, 110 and 500 pods on the node (2 devices each) and ten times as many
claims on another node (each with a pod there), a real sidecar process runs
against the API stand-in while the benchmark driver (a process) resends the
same health every second. Counted from the stand-in's request log: what the
start costs (the pod list, the pod watch, one GET per claim of the node's
pods; never a claim of another node, never a claim list or watch), requests per
minute at steady state (target: none beyond the open watch) and during a storm
(every device flips every 0.5 s), which the writer's token bucket caps.

Issue 7's claim, "load grows with the node's pods only", is checked in the
storm, where it can fail: every request names the node's own pods (their
status, or an Event in their namespace), never an object elsewhere and never a
claim or a pod list; each pod is written at most once per flip (plus one); and
all requests fit the writer's token bucket, full when the storm starts after
the quiet steady phase: at most ``burst + qps * seconds`` (+ a slack for the
stand-in's timestamps). The pods x flips bound is what binds at 10 pods, the
bucket at 110 and 500, so each is reached by one of the sizes; the ratio
reported is the storm's requests against the bucket at the biggest size (about
1.0 there: the bucket is what limits).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from benchmarks import _common as c
from kubelet_dra.testing import FakeApiServer

NAME = "apiload"
PER_POD = 2
FLIP = 0.5  # seconds between the storm's flips of every device
QPS, BURST = 50.0, 100  # the writer's defaults
SLACK = 5  # requests over a bound allowed for the stand-in's timestamps


@dataclasses.dataclass(frozen=True)
class Config:
    pods: tuple[int, ...]
    seconds: float


FULL = Config(pods=(10, 110, 500), seconds=20.0)
QUICK = Config(pods=(10, 110, 500), seconds=2.0)
SMOKE = Config(pods=(10,), seconds=1.0)


def _kinds(requests: list) -> dict[str, int]:  # type: ignore[type-arg]
    kinds = {"pod list": 0, "pod watch": 0, "claim GET (node)": 0, "claim GET (elsewhere)": 0,
             "claim list/watch": 0, "status PATCH": 0, "event": 0, "other": 0}  # fmt: skip
    for r in requests:
        if "/resourceclaims" in r.path:
            if r.path.endswith("/resourceclaims"):
                kinds["claim list/watch"] += 1
            elif "/namespaces/elsewhere/" in r.path:
                kinds["claim GET (elsewhere)"] += 1
            else:
                kinds["claim GET (node)"] += 1
        elif r.path.endswith("/pods") and r.method == "GET":
            kinds["pod watch" if r.is_watch else "pod list"] += 1
        elif r.is_status_write:
            kinds["status PATCH"] += 1
        elif "/events" in r.path:
            kinds["event"] += 1
        else:
            kinds["other"] += 1
    return kinds


def _quiet_for(api: FakeApiServer, seconds: float) -> bool:
    """No request but watches for ``seconds``: the start-up wave (at 50 QPS) is over."""
    stamps = [r.timestamp for r in api.requests if not r.is_watch]
    return not stamps or time.time() - max(stamps) >= seconds


async def _once(pods: int, seconds: float) -> dict[str, Any]:
    with c.short_tmpdir() as workdir, c.api_server() as api:
        layout = c.build_cluster(api, pods=pods, devices_per_pod=PER_POD, other_claims=10 * pods)
        async with c.DriverProcess(workdir, devices=pods * PER_POD, chunk=100) as drv:
            await drv.send("steady", pattern=0, period=1.0)
            with c.SidecarProcess(workdir / "side", api, registry=drv.registry) as sidecar:
                await sidecar.wait_ready(timeout=60)
                await c.wait_until(
                    lambda: c.pods_match(api, layout, lambda d: "Healthy"), timeout=60,
                    what="every pod Healthy", interval=0.05,
                )  # fmt: skip
                await c.wait_until(
                    lambda: _quiet_for(api, 2.0), timeout=120, what="the start-up writes to end",
                    interval=0.1,
                )  # fmt: skip
                start = _kinds(api.requests)
                api.reset_log()
                await asyncio.sleep(seconds)
                steady = [r for r in api.requests if not r.is_watch]
                api.reset_log()
                await drv.send("flip", period=FLIP)
                await asyncio.sleep(seconds)
                storm = [r for r in api.requests if not r.is_watch]
                foreign = [r for r in storm if not _names_the_node(r, layout)]
                await drv.send("steady", pattern=0, period=1.0)
                await c.wait_until(
                    lambda: c.pods_match(api, layout, lambda d: "Healthy"), timeout=60,
                    what="every pod Healthy after the storm", interval=0.05,
                )  # fmt: skip
    per_pod: dict[str, int] = {}
    for r in storm:
        if r.is_status_write:
            per_pod[r.path] = per_pod.get(r.path, 0) + 1
    return {"start": start, "steady": len(steady) * 60 / seconds,
            "storm": len(storm) * 60 / seconds, "storm_kinds": _kinds(storm),
            "storm_requests": len(storm), "foreign": len(foreign),
            "most_per_pod": max(per_pod.values(), default=0)}  # fmt: skip


def _names_the_node(request: Any, layout: dict[str, list[int]]) -> bool:
    """A status write of one of the node's pods, or an Event in their namespace."""
    if request.is_status_write:
        return any(request.path.endswith(f"/namespaces/default/pods/{p}/status") for p in layout)
    return "/namespaces/default/events" in request.path


def storm_bounds(pods: int, seconds: float) -> tuple[float, float]:
    """(pods x flips bound on status writes, token-bucket bound on all requests) of a
    storm of ``seconds``: each pod changes once per flip, the bucket starts full."""
    flips = seconds / FLIP + 1
    return pods * flips, BURST + QPS * seconds


async def run(config: Config) -> c.Outcome:
    out = c.Outcome(NAME)
    rows = []
    results: dict[int, dict[str, Any]] = {}
    for pods in config.pods:
        res = await _once(pods, config.seconds)
        results[pods] = res
        start = res["start"]
        out.check(
            start["claim GET (elsewhere)"] == 0, f"apiload {pods}: read claims of another node"
        )
        out.check(start["claim list/watch"] == 0, f"apiload {pods}: listed or watched claims")
        out.check(start["claim GET (node)"] >= pods, f"apiload {pods}: did not read every claim")
        flips, bucket = storm_bounds(pods, config.seconds)
        out.check(
            res["foreign"] == 0,
            f"apiload {pods}: {res['foreign']} storm requests not about the node's pods",
        )
        out.check(
            res["most_per_pod"] <= config.seconds / FLIP + 1,
            f"apiload {pods}: a pod was written {res['most_per_pod']} times in "
            f"{config.seconds / FLIP:.0f} flips",
        )
        out.check(
            res["storm_requests"] <= bucket + SLACK,
            f"apiload {pods}: {res['storm_requests']} storm requests, bucket {bucket:.0f}",
        )
        rows.append((
            pods, 10 * pods, start["pod list"], start["pod watch"], start["claim GET (node)"],
            start["claim GET (elsewhere)"], start["status PATCH"], start["event"],
            f"{res['steady']:.0f}", f"{res['storm']:.0f}", res["storm_requests"],
            f"{flips:.0f} writes / {bucket:.0f}", res["most_per_pod"], res["foreign"],
        ))  # fmt: skip
    out.table(
        f"API load per node (one run each; steady and storm over {config.seconds:g} s, "
        "as requests per minute; watches not counted there)",
        ["node pods", "claims elsewhere", "start: pod list", "pod watch", "claim GETs (node)",
         "claim GETs (elsewhere)", "status PATCHes", "events", "steady /min", "storm /min",
         "storm requests", "bounds: pods x flips / bucket", "most writes of one pod",
         "storm requests not about the node's pods"],
        rows,
    )  # fmt: skip
    steady_zero = all(float(r["steady"]) == 0 for r in results.values())
    out.summary.append(
        c.SummaryRow(
            "7 API load, steady",
            ", ".join(f"{p} pods: {float(r['steady']):.0f}/min" for p, r in results.items()),
            "0 beyond the watch",
            "—",
            "no requests at steady state",
            steady_zero,
        )
    )
    biggest = max(results)
    ratio = results[biggest]["storm_requests"] / storm_bounds(biggest, config.seconds)[1]
    storm_ok = all(
        r["foreign"] == 0 and r["storm_requests"] <= storm_bounds(p, config.seconds)[1] + SLACK
        and r["most_per_pod"] <= config.seconds / FLIP + 1
        for p, r in results.items()
    )  # fmt: skip
    smallest = min(results)
    out.summary.append(
        c.SummaryRow(
            "7 API load, storm",
            ", ".join(f"{p} pods: {float(r['storm']):.0f}/min" for p, r in results.items())
            + f"; most writes of one pod at {smallest} pods: "
            f"{results[smallest]['most_per_pod']} of {config.seconds / FLIP:.0f} flips",
            f"bucket: burst {BURST} + QPS {QPS:g} x {config.seconds:g} s",
            f"{ratio:.2f}x bucket at {biggest}",
            "only the node's pods; ≤ 1 write per pod and flip; within the bucket",
            storm_ok,
            value=ratio,
            better="lower",
        )
    )
    return out

"""Scenario 2, latency: from the driver's send to the PATCH arriving at the API stand-in.

The sidecar is a real ``python -m kubelet_dra run`` process; the driver
(:class:`kubelet_dra.testing.FakeDriver`) and the API stand-in
(:class:`kubelet_dra.testing.FakeApiServer`) run in this process, so both ends
of the measurement read the same clock (``time.time``): the driver's send is
stamped just before ``set_health``, the arrival is the stand-in's
``RequestRecord.timestamp`` (taken when it logs the request, after applying it,
so the figure is slightly pessimistic). 110 pods with 8 devices each; one
device changes at a time (the next change only after the previous PATCH and a
quiet window).

The floors, measured in the same run. The targets are judged against the
same-topology floor: the driver's report goes to a bare relay process
(``benchmarks._relay``, started as the sidecar is), which sends one pre-built
PATCH of the writer's full form and size (its ``test`` operations, the 8 entries,
the DeviceHealthy condition) on a kept-alive connection to the same stand-in, so
it crosses the same two process boundaries as the pipeline and does none of its
work. It is measured before each window, with that window's pacing (changes
``window`` + 10 ms apart): on a busy machine a process idle for 60 ms wakes more
slowly than one idle for 10 ms, in the floor as in the pipeline. The older
in-process floor, one gRPC message (FakeDriver to a bare client in this process)
plus one raw PATCH (http.client from this process), is kept as rows and under
its old summary names, so ``--compare`` against an older baseline still matches.

A reference row, not part of the floor, sends the writer's kind of PATCH raw
(http.client, same connection handling as the floor): a JSON patch with its
``test`` operations setting one container's 8 entries of a pod like the
scenario's. It shows how much of the gap to the floor is the stand-in's own
work on that request rather than the sidecar's (issue 15).

The writer waits one coalescing window (``write_window``, default 50 ms) before
each round, so the scenario runs with the default and with ``write_window=0``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time

from benchmarks import _common as c
from kubelet_dra.testing import FakeApiServer, FakeDriver

NAME = "latency"
PODS, DEVICES_PER_POD = 110, 8


@dataclasses.dataclass(frozen=True)
class Config:
    changes: int
    floor_samples: int
    windows: tuple[float, ...]


FULL = Config(changes=200, floor_samples=300, windows=(0.05, 0.0))
QUICK = Config(changes=30, floor_samples=100, windows=(0.05, 0.0))
SMOKE = Config(changes=5, floor_samples=10, windows=(0.0,))


def _device(i: int, health: str) -> dict[str, object]:
    return {"pool": c.POOL, "device": c.device_name(i), "health": health, "timeout_seconds": 3600}


async def _measure(  # type: ignore[no-untyped-def]
    api: FakeApiServer, workdir, window: float, changes: int, pause: float | None = None
) -> list[float]:
    """Latencies of ``changes`` single-device changes through a fresh sidecar, each after
    the previous one's PATCH and ``pause`` (default: the window and 10 ms) of quiet."""
    layout = {
        f"pod-{p:04d}": [p * DEVICES_PER_POD + k for k in range(DEVICES_PER_POD)]
        for p in range(PODS)
    }
    total = PODS * DEVICES_PER_POD
    tag = f"{window}-{pause}-{time.monotonic_ns()}"
    registry = workdir / f"reg-{tag}"
    state = {i: "Healthy" for i in range(total)}
    rng = random.Random(7)
    samples: list[float] = []
    async with FakeDriver(name=c.DRIVER, registry=registry) as drv:
        await drv.set_health(*[_device(i, "Healthy") for i in range(total)])
        sidecar = c.SidecarProcess(
            workdir / f"side-{tag}", api, registry=registry, write_window=window
        )
        with sidecar:
            await sidecar.wait_ready()
            await c.wait_until(
                lambda: c.pods_match(api, layout, state.__getitem__), timeout=60,
                what="every pod showing Healthy", interval=0.05,
            )  # fmt: skip
            for _ in range(changes):
                pod = rng.randrange(PODS)
                device = pod * DEVICES_PER_POD + rng.randrange(DEVICES_PER_POD)
                state[device] = "Unhealthy" if state[device] == "Healthy" else "Healthy"
                rid, want, path = (
                    c.resource_id(device),
                    state[device],
                    f"/pods/pod-{pod:04d}/status",
                )
                api.reset_log()
                sent = time.time()
                await drv.set_health(_device(device, want))

                def arrived(path: str = path, rid: str = rid, want: str = want) -> float | None:
                    for r in api.requests:
                        ours = r.is_status_write and r.path.endswith(path)
                        if ours and c.written_health(r.body).get(rid) == want:
                            return r.timestamp
                    return None

                await c.wait_until(
                    lambda: arrived() is not None, timeout=10, what=f"PATCH of {rid}"
                )
                samples.append(float(arrived() or 0.0) - sent)
                await asyncio.sleep(window + 0.01 if pause is None else pause)
            await asyncio.sleep(0.3)
            bad = c.mismatches(api, layout, state.__getitem__)
            if bad:
                raise c.CheckFailed(f"latency (window {window}): {bad} devices show a wrong health")
    return samples


def _writer_ops(uid: str, ref: str, devices: list[str], unhealthy: int) -> list[dict[str, object]]:
    """The writer's kind of JSON patch: its ``test`` operations, then one container's
    entries of a pod of the scenario's size, device ``unhealthy`` Unhealthy."""
    resources = [
        {"resourceID": f"{c.DRIVER}/{c.POOL}/{d}",
         "health": "Unhealthy" if i == unhealthy else "Healthy"}
        for i, d in enumerate(devices)
    ]  # fmt: skip
    return [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": "/status/containerStatuses/0/name", "value": "main"},
        {"op": "add", "path": "/status/containerStatuses/0/allocatedResourcesStatus",
         "value": [{"name": f"claim:{ref}", "resources": resources}]},
    ]  # fmt: skip


def _floor_pod(api: FakeApiServer, name: str, first_device: int) -> tuple[str, str, list[str]]:
    """A pod with one claim of 8 devices on another node: (uid, claim ref, devices)."""
    from kubelet_dra.testing import make_claim, make_pod

    devices = [c.device_name(first_device + k) for k in range(DEVICES_PER_POD)]
    results = [(c.DRIVER, c.POOL, d, "gpu") for d in devices]
    api.create_claim(
        make_claim(f"{name}-claim", namespace="floor", results=results, node="node-floor")
    )
    pod = api.create_pod(make_pod(name, "node-floor", namespace="floor", claims=[f"{name}-claim"]))
    return pod["metadata"]["uid"], pod["spec"]["resourceClaims"][0]["name"], devices


def _writer_patch_reference(api: FakeApiServer, samples: int) -> list[float]:
    """Seconds from send to the stand-in logging it, for the writer's kind of PATCH
    sent raw on a persistent http.client connection (as the floor's PATCH is)."""
    import json

    uid, ref, devices = _floor_pod(api, "ref-pod", 900_000)
    bodies = (
        json.dumps(_writer_ops(uid, ref, devices, k % DEVICES_PER_POD)) for k in range(samples)
    )
    return c.time_raw_patches(
        api, "ref-pod", "application/json-patch+json", bodies, "reference PATCH"
    )


def _relay_bodies(api: FakeApiServer, name: str) -> list[str]:
    """Two PATCH bodies of the writer's full form and size (~1,900 bytes): tests of the
    UID, the container and the entries it replaces, the entries, and the pod's
    DeviceHealthy condition tested and replaced. The relay sends them alternately; each
    one's ``test`` holds after the other, and the pod is set up so the first one's does."""
    import http.client
    import json

    uid, ref, devices = _floor_pod(api, name, 910_000)
    at = len(api.get_pod("floor", name)["status"].get("conditions") or [])
    container = "/status/containerStatuses/0"
    ars = f"{container}/allocatedResourcesStatus"

    def entries(unhealthy: int) -> list[object]:
        return _writer_ops(uid, ref, devices, unhealthy)[2]["value"]  # type: ignore[return-value]

    def condition(unhealthy: int) -> dict[str, str]:
        return {
            "type": "DeviceHealthy", "status": "False", "reason": "DeviceUnhealthy",
            "message": f"Unhealthy devices: {c.DRIVER}/{c.POOL}/{devices[unhealthy]} "
                       f"(claim {name}-claim)",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }  # fmt: skip

    def body(now: int, before: int) -> str:
        return json.dumps([
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "test", "path": f"{container}/name", "value": "main"},
            {"op": "test", "path": ars, "value": entries(before)},
            {"op": "add", "path": ars, "value": entries(now)},
            {"op": "test", "path": f"/status/conditions/{at}/type", "value": "DeviceHealthy"},
            {"op": "replace", "path": f"/status/conditions/{at}", "value": condition(now)},
        ])  # fmt: skip

    set_up = [
        {"op": "add", "path": ars, "value": entries(1)},
        {"op": "add", "path": "/status/conditions/-", "value": condition(1)},
    ]
    host, port = api.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port))
    try:
        conn.request(
            "PATCH",
            f"/api/v1/namespaces/floor/pods/{name}/status",
            json.dumps(set_up),
            {"Content-Type": "application/json-patch+json", "Authorization": f"Bearer {api.token}"},
        )
        response = conn.getresponse()
        if response.status != 200:
            raise c.CheckFailed(f"relay pod set-up answered {response.status}: {response.read()!r}")
    finally:
        conn.close()
    return [body(0, 1), body(1, 0)]


async def _relay_floor(  # type: ignore[no-untyped-def]
    api: FakeApiServer, workdir, samples: int, pause: float, name: str = "relay-pod"
) -> list[float]:
    """The same-topology floor: driver send → a bare relay process (``benchmarks._relay``)
    → its pre-built PATCH of the writer's size logged by the stand-in. Same driver set-up
    (one report of every device, then single-device reports ``pause`` apart)."""
    import json
    import sys

    workdir.mkdir(parents=True, exist_ok=True)
    bodies = workdir / "bodies.json"
    bodies.write_text(json.dumps(_relay_bodies(api, name)))
    path = f"/api/v1/namespaces/floor/pods/{name}/status?fieldManager=bench"
    total = PODS * DEVICES_PER_POD
    found: list[float] = []
    async with FakeDriver(name=c.DRIVER, registry=workdir / "reg") as drv:
        await drv.set_health(*[_device(i, "Healthy") for i in range(total)])
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks._relay", "--socket", str(drv.dra_socket),
            "--api", api.url.removeprefix("http://"), "--path", path, "--bodies", str(bodies),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env=c.quiet_env(), cwd=c._ROOT,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(f"{api.token}\n".encode())
            await proc.stdin.drain()
            if (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() != b"ready":
                raise c.CheckFailed(f"relay exited with {await proc.wait()} before it was ready")
            await drv.wait_for_streams(1, timeout=30)

            def arrived() -> float | None:
                mine = [r for r in api.requests if r.path.endswith(f"{name}/status")]
                if mine and mine[-1].status != 200:
                    raise c.CheckFailed(f"relay's PATCH answered {mine[-1].status}")
                return mine[-1].timestamp if mine else None

            def done() -> bool:
                if proc.returncode is not None:
                    raise c.CheckFailed(f"relay exited with {proc.returncode}")
                return arrived() is not None

            # The first report (every device) is sent when the stream opens: wait for its PATCH.
            await c.wait_until(done, timeout=30, what="relay's first PATCH")
            rng = random.Random(11)
            for _ in range(samples):
                await asyncio.sleep(pause)
                api.reset_log()
                device = rng.randrange(total)
                sent = time.time()
                await drv.set_health(_device(device, rng.choice(("Healthy", "Unhealthy"))))
                await c.wait_until(done, timeout=10, what="relay's PATCH")
                found.append(float(arrived() or 0.0) - sent)
        finally:
            if proc.returncode is None:
                proc.terminate()
            await proc.wait()
            api.reset_log()
    return found


def _pacing(window: float) -> str:
    return f"{(window + 0.01) * 1000:g} ms apart"


async def run(config: Config) -> c.Outcome:
    out = c.Outcome(NAME)
    with c.short_tmpdir() as workdir, c.api_server() as api:
        c.build_cluster(api, pods=PODS, devices_per_pod=DEVICES_PER_POD)
        grpc_s = c.Spread.of(await c.grpc_floor(workdir, config.floor_samples))
        patch_s = c.Spread.of(c.patch_floor(api, config.floor_samples))
        in_process = grpc_s.median + patch_s.median
        ours_s = c.Spread.of(_writer_patch_reference(api, config.floor_samples))
        relays: dict[float, list[float]] = {}
        results: dict[float, list[float]] = {}
        for k, window in enumerate(config.windows):
            # Each window's floor right before it, paced as it is (window + 10 ms of quiet
            # between changes): 60 ms of idleness costs every process on the path a
            # slower wake-up than 10 ms does, in the floor as in the pipeline.
            relays[window] = await _relay_floor(
                api, workdir / f"relay-{k}", config.floor_samples, window + 0.01, f"relay-{k}"
            )
            results[window] = await _measure(api, workdir, window, config.changes)
    ms = 1000.0
    rows = [
        ("floor: one gRPC message (in process)", c.num(grpc_s.median * ms), "", "",
         c.num(grpc_s.high * ms), "", ""),
        ("floor: one raw PATCH (in process)", c.num(patch_s.median * ms), "", "",
         c.num(patch_s.high * ms), "", ""),
        ("floor: in process, gRPC + PATCH", c.num(in_process * ms), "", "", "", "", "1.0 x"),
        ("reference: the writer's JSON patch, raw (in process)", c.num(ours_s.median * ms),
         "", "", c.num(ours_s.high * ms), "",
         f"{(grpc_s.median + ours_s.median) / in_process:.1f} x (+ gRPC)"),
    ]  # fmt: skip
    for window, relay in relays.items():
        floor = c.percentile(relay, 50)
        rows.append(
            (f"floor: same topology, driver → relay process → API, {_pacing(window)}",
             c.num(floor * ms), c.num(c.percentile(relay, 90) * ms),
             c.num(c.percentile(relay, 99) * ms), c.num(max(relay) * ms), "1.0 x",
             f"{floor / in_process:.1f} x")
        )  # fmt: skip
    for window, samples in results.items():
        floor = c.percentile(relays[window], 50)
        p50, p90, p99 = (c.percentile(samples, q) for q in (50, 90, 99))
        rows.append(
            (f"pipeline, write_window={window * ms:g} ms", c.num(p50 * ms), c.num(p90 * ms),
             c.num(p99 * ms), c.num(max(samples) * ms), f"{p50 / floor:.1f} x",
             f"{p50 / in_process:.1f} x")
        )  # fmt: skip
        figure = f"p50 {c.num(p50 * ms)} ms, p99 {c.num(p99 * ms)} ms"
        bound = 2 if window == 0 else 3  # issue 15: 2x with window 0, 3x with the window
        # The target is judged against the floor that travels the same path (two process
        # crossings); the in-process floor's row is kept, under its old name, for --compare.
        out.summary.append(
            c.SummaryRow(
                f"2 latency, window {window * ms:g} ms, same-topology floor",
                figure,
                f"{c.num(floor * ms)} ms (driver → relay process → API, {_pacing(window)})",
                f"{p50 / floor:.1f}x",
                f"p50 ≤ {bound}x floor, p99 < 10 ms",
                p50 <= bound * floor and p99 < 0.010,
                value=p50 / floor,
                better="lower",
            )
        )
        out.summary.append(
            c.SummaryRow(
                f"2 latency, window {window * ms:g} ms",
                figure,
                f"{c.num(in_process * ms)} ms (gRPC + PATCH, in process)",
                f"{p50 / in_process:.1f}x",
                "report (in-process floor)",
                None,
                value=p50 / in_process,
                better="lower",
            )
        )
    out.table(
        f"Latency: driver send → PATCH at the API, ms ({config.changes} single-device changes, "
        f"{PODS} pods x {DEVICES_PER_POD} devices; same-topology floors: "
        f"{config.floor_samples} reports each)",
        ["path", "p50", "p90", "p99", "max", "p50 / same-topology floor", "p50 / in-process floor"],
        rows,
    )
    return out

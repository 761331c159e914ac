"""Scenario 6, memory: peak RSS of the sidecar at 10,000 devices, 110 pods, 1,000 claims.

The sidecar is a real ``python -m kubelet_dra run`` process; the benchmark driver
(a process) reports 10,000 devices in messages of 100 every second; the API
stand-in holds 110 pods on the node (8 devices each) and 1,000 claims in all
(890 on another node). Once every pod shows its health and a few heartbeats
went through, the sidecar's ``VmHWM`` (peak RSS) is read from
``/proc/<pid>/status``.

The floor is a process that does the least the sidecar must: it caps glibc's
malloc arenas as ``run`` does (``mallopt(M_ARENA_MAX, 2)`` unless
``MALLOC_ARENA_MAX`` is set, :func:`kubelet_dra.memtrim.cap_arenas`),
imports grpc, ``kubernetes.client`` and sqlitedict, and uses each once: a
health stream read, the node's pods listed from the same API stand-in through
the client's low-level ``ApiClient`` (``param_serialize`` + ``call_api``, the
raw answer decoded with ``json``, as ``kube/api.py`` does: no ``CoreV1Api``, no
``V1Pod`` models) and a sqlitedict commit. Anything less would not be the same
libraries used the same way, so the sidecar cannot be below it by design; the
ratio says what the pipeline's state and tasks cost on top.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from typing import Any

from benchmarks import _common as c

NAME = "memory"
DEVICES, PODS, PER_POD, CLAIMS = 10_000, 110, 8, 1_000


@dataclasses.dataclass(frozen=True)
class Config:
    runs: int
    settle: float


FULL = Config(runs=3, settle=5.0)
QUICK = Config(runs=1, settle=3.0)
SMOKE = Config(runs=1, settle=1.0)

FLOOR_SCRIPT = """
import ctypes, json, os, pathlib, sys, tempfile
capped = "MALLOC_ARENA_MAX" in os.environ  # as kubelet_dra.memtrim.cap_arenas
if not capped:
    capped = ctypes.CDLL("libc.so.6").mallopt(-8, 2) == 1  # M_ARENA_MAX
import grpc, kubernetes.client, sqlitedict
from kubelet_dra._proto.dra_health.v1 import api_pb2 as pb, api_pb2_grpc as pb_grpc
socket, url, token = sys.argv[1:4]
with grpc.insecure_channel("unix:" + socket) as channel:
    call = pb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(pb.NodeWatchResourcesRequest())
    first = next(iter(call))
    call.cancel()
config = kubernetes.client.Configuration()
config.host = url
config.api_key = {"authorization": token}
config.api_key_prefix = {"authorization": "Bearer"}
with kubernetes.client.ApiClient(config) as client:
    request = client.param_serialize(
        method="GET", resource_path="/api/v1/pods",
        query_params=[("fieldSelector", "spec.nodeName=node-1")],
        header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
    )
    response = client.call_api(*request)
    pods = json.loads(response.response.data)
    loaded = sys.modules.get("kubernetes.client.api.core_v1_api") is not None
with tempfile.TemporaryDirectory() as tmp:
    db = sqlitedict.SqliteDict(str(pathlib.Path(tmp) / "x.sqlite"), autocommit=False)
    for i in range(1000):
        db[str(i)] = {"health": "Healthy"}
    db.commit()
    db.close()
status = dict(l.split(":", 1) for l in pathlib.Path("/proc/self/status").read_text().splitlines())
print(json.dumps({"hwm": int(status["VmHWM"].split()[0]), "pods": len(pods["items"]),
                  "devices": len(first.devices), "core_v1_api": loaded, "arenas_capped": capped}))
"""


def floor_process(dra_socket: str | os.PathLike[str], api: Any) -> dict[str, Any]:
    """Run the floor process against a driver's socket and the API stand-in; what it
    reports (its peak RSS in kB, what it read, how it ran)."""
    floor = subprocess.run(
        [sys.executable, "-c", FLOOR_SCRIPT, os.fspath(dra_socket), api.url, f"{api.token}"],
        check=True,
        capture_output=True,
        env=c.quiet_env(),
    )
    found: dict[str, Any] = json.loads(floor.stdout)
    return found


def check_floor(info: dict[str, Any], *, devices: int, pods: int) -> None:
    """The floor is a lower bound only if it ran as the sidecar runs: its libraries used
    (a health message, the node's pods), the arenas capped, no ``CoreV1Api`` loaded."""
    if info["devices"] != devices or info["pods"] < pods:
        raise c.CheckFailed(f"memory floor process did not use its libraries: {info}")
    if not info["arenas_capped"]:
        raise c.CheckFailed(f"memory floor ran without the sidecar's malloc arena cap: {info}")
    if info["core_v1_api"]:
        raise c.CheckFailed(f"memory floor loaded CoreV1Api, which the sidecar does not: {info}")


async def _once(config: Config) -> tuple[int, int, int]:
    with c.short_tmpdir() as workdir, c.api_server() as api:
        layout = c.build_cluster(
            api, pods=PODS, devices_per_pod=PER_POD, other_claims=CLAIMS - PODS
        )
        async with c.DriverProcess(workdir, devices=DEVICES, chunk=100) as drv:
            await drv.send("steady", pattern=1, period=1.0)
            floor_info = await asyncio.to_thread(floor_process, drv.dra_socket, api)
            with c.SidecarProcess(workdir / "side", api, registry=drv.registry) as sidecar:
                from benchmarks import _driver

                await sidecar.wait_ready(timeout=60)
                await c.wait_until(
                    lambda: c.pods_match(api, layout, lambda d: _driver.pattern_health(d, 1)),
                    timeout=60, what="every pod showing its health", interval=0.05,
                )  # fmt: skip
                await asyncio.sleep(config.settle)
                vm = c.vm_status(sidecar.pid)
    check_floor(floor_info, devices=100, pods=PODS)
    return vm["VmHWM"], vm["VmRSS"], int(floor_info["hwm"])


async def run(config: Config) -> c.Outcome:
    out = c.Outcome(NAME)
    runs = [await _once(config) for _ in range(config.runs)]
    hwm, rss, floor = (c.Spread.of(x[i] / 1024 for x in runs) for i in range(3))
    out.table(
        f"Memory: MB (median [min-max] of {config.runs} runs); {DEVICES:,} devices, "
        f"{PODS} pods, {CLAIMS:,} claims in the cluster",
        ["process", "peak RSS (VmHWM)", "RSS at the end"],
        [("floor: arenas capped, grpc + ApiClient + sqlitedict used once", floor.fmt(" MB"), ""),
         ("sidecar", hwm.fmt(" MB"), rss.fmt(" MB"))],
    )  # fmt: skip
    out.summary.append(
        c.SummaryRow(
            "6 memory, 10,000 devices",
            f"{hwm.median:.0f} MB peak RSS",
            f"{floor.median:.0f} MB (arena cap, raw ApiClient, one use each)",
            f"{hwm.median / floor.median:.2f}x",
            "≤ 1.1x floor",
            hwm.median <= 1.1 * floor.median,
            value=hwm.median / floor.median,
            better="lower",
        )
    )
    return out

"""One process of the ``fleet`` benchmark: several nodes, each our library plus a FakeDriver.

``python -m benchmarks._fleetnode --kubeconfig K --workdir W --nodes n0000,n0001,...``
starts, for every node name, a :class:`kubelet_dra.testing.FakeDriver` with
``--devices`` devices (all Healthy) in its own plugin registry and a
:class:`kubelet_dra.DRAHealthManager` for that node, with its own API client
(its own connection pool, pod watch, token bucket and state file), exactly
what one sidecar runs, minus the metrics server. Many nodes share one event
loop, which is the point: a fleet of 200 sidecar processes at ~60 MB each does
not fit next to the other work on a 2-core machine.

Control: JSON lines on stdin, answers on stdout.
``{"op": "health", "nodes": [...], "devices": [0, 1] | null, "health": "Unhealthy"}``
sets those devices of those nodes' drivers (null: every device) and answers
``{"event": "sent", "t": <wall clock after the last send>}``;
``{"op": "stats"}`` answers RSS, CPU seconds, the writers' request counters and
the request-body bytes every node's client sent (counted in urllib3 and in the
status PATCH's event-loop transport);
``{"op": "lists", "since": T}`` answers every pod LIST a node started at or
after wall time ``T``: ``[[t, ok], ...]`` (``ok``: the server answered it);
``{"op": "jitter", "on": false}`` makes every node's relist backoff draw the
top of its range, i.e. the fixed doubling schedule from before issue 15 (the
apiserver-restart case measures both in one run); ``{"op": "stop"}`` closes
everything.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import pathlib
import random
import resource
import sys
import time
from typing import Any

DRIVER = "gpu.fleet.example.com"
POOL = "pool"

_SENT_BYTES = [0, 0]  # request-body bytes, requests: every client in this process


def count_request_bytes() -> None:
    """Count request bodies on both ways a node sends: urllib3's ``urlopen`` (every
    ``ApiClient`` call: lists, claim reads, events) and the status PATCH's event-loop
    transport (``kube/asyncpatch.py``), at its ``_send``: a repeat after a 401 counts
    again, the one repeat on a fresh connection when a kept-alive one was found closed
    (inside ``_send``) does not."""
    import urllib3.connectionpool

    from kubelet_dra.kube import asyncpatch

    original = urllib3.connectionpool.HTTPConnectionPool.urlopen

    def urlopen(self: Any, method: str, url: str, body: Any = None, *a: Any, **kw: Any) -> Any:
        _SENT_BYTES[0] += len(body) if isinstance(body, bytes | str) else 0
        _SENT_BYTES[1] += 1
        return original(self, method, url, body, *a, **kw)

    urllib3.connectionpool.HTTPConnectionPool.urlopen = urlopen  # type: ignore[method-assign]
    send = asyncpatch.Transport._send

    async def counted(self: Any, method: str, path: str, query: str, body: bytes, *a: Any) -> Any:
        _SENT_BYTES[0] += len(body)
        _SENT_BYTES[1] += 1
        return await send(self, method, path, query, body, *a)

    asyncpatch.Transport._send = counted  # type: ignore[method-assign,assignment]


_LISTS: list[tuple[float, bool]] = []  # every pod LIST a node started: wall time, answered


def record_lists() -> None:
    """Record when each node lists its pods (``Api.list_node_pods``) and whether it got an
    answer: the relists after an apiserver restart, timed from the nodes' side."""
    from kubelet_dra.kube import api as kube_api

    original = kube_api.Api.list_node_pods

    def list_node_pods(self: Any, node: str, **page: Any) -> Any:
        if page.get("token"):  # a later page of a list already recorded
            return original(self, node, **page)
        started = time.time()
        try:
            listed = original(self, node, **page)
        except Exception:
            _LISTS.append((started, False))
            raise
        _LISTS.append((started, True))
        return listed

    kube_api.Api.list_node_pods = list_node_pods  # type: ignore[method-assign]


class SwitchableJitter(random.Random):
    """The nodes' relist rng: full jitter, or (``on = False``) always the top of the range,
    which is the fixed doubling schedule the relist backoff had before issue 15."""

    on = True

    def uniform(self, a: float, b: float) -> float:
        return super().uniform(a, b) if self.on else b


JITTER = SwitchableJitter()


def inject_relist_rng() -> None:
    """Give every node's ``NodePods`` the switchable rng (the manager passes none)."""
    from kubelet_dra.kube import pods

    original = pods.NodePods.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("rng", JITTER)
        original(self, *args, **kwargs)

    pods.NodePods.__init__ = init  # type: ignore[method-assign]


def device_name(k: int) -> str:
    return f"dev-{k}"


class Node:
    """A FakeDriver and a DRAHealthManager for one node name."""

    def __init__(self, name: str, workdir: pathlib.Path, kubeconfig: str, devices: int) -> None:
        import kubelet_dra

        self.name = name
        self.health = {k: "Healthy" for k in range(devices)}
        base = workdir / name
        self.registry = base / "reg"
        self.registry.mkdir(parents=True, exist_ok=True)
        self.settings = kubelet_dra.Settings(
            node_name=name,
            kubeconfig=pathlib.Path(kubeconfig),
            plugins_registry=self.registry,
            state_dir=base / "state",
            health_timeout=3600,
            pod_resources_socket=None,  # no kubelet on a simulated node
        )
        self.driver: Any = None
        self.manager: Any = None

    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        import kubelet_dra
        from kubelet_dra.testing import FakeDriver

        self.driver = await stack.enter_async_context(
            FakeDriver(name=DRIVER, registry=self.registry)
        )
        await self.send()
        self.manager = await stack.enter_async_context(kubelet_dra.DRAHealthManager(self.settings))

    async def send(self) -> None:
        await self.driver.set_health(
            *({"pool": POOL, "device": device_name(k), "health": h} for k, h in self.health.items())
        )

    def writer_counts(self) -> dict[str, int]:
        writer = getattr(self.manager, "writer", None)
        if writer is None:
            return {}
        counts = {f"result_{k}": int(v) for k, v in writer.stats.results.items()}
        counts["requests"] = int(writer.stats.requests)
        return counts


def _stats(nodes: list[Node]) -> dict[str, Any]:
    status: dict[str, int] = {}
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            status[key] = int(value.split()[0])
    usage = resource.getrusage(resource.RUSAGE_SELF)
    totals: dict[str, int] = {}
    for node in nodes:
        for name, count in node.writer_counts().items():
            totals[name] = totals.get(name, 0) + count
    return {
        "event": "stats",
        "rss_kb": status.get("VmRSS", 0),
        "hwm_kb": status.get("VmHWM", 0),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "sent_bytes": _SENT_BYTES[0],
        "http_requests": _SENT_BYTES[1],
        "writers": totals,
    }


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def _commands(nodes: dict[str, Node]) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        command = json.loads(line)
        op = command.get("op")
        if op == "stop":
            return
        if op == "stats":
            _emit(_stats(list(nodes.values())))
        elif op == "lists":
            since = float(command.get("since") or 0.0)
            _emit({"event": "lists", "lists": [[t, ok] for t, ok in _LISTS if t >= since]})
        elif op == "jitter":
            JITTER.on = bool(command["on"])
            _emit({"event": "jitter", "on": JITTER.on})
        elif op == "health":
            chosen = [nodes[n] for n in command["nodes"] if n in nodes]
            for node in chosen:
                for k in command.get("devices") or list(node.health):
                    node.health[int(k)] = str(command["health"])
            await asyncio.gather(*(node.send() for node in chosen))
            _emit({"event": "sent", "t": time.time(), "nodes": len(chosen)})
        else:
            _emit({"event": "error", "message": f"unknown op {op!r}"})


async def amain(ns: argparse.Namespace) -> None:
    # One sidecar has its own pool of I/O threads; many nodes on one loop need more
    # than the default min(32, CPUs + 4) for their writes and claim reads.
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(max_workers=ns.threads, thread_name_prefix="io")
    )
    workdir = pathlib.Path(ns.workdir)
    nodes = {name: Node(name, workdir, ns.kubeconfig, ns.devices) for name in ns.nodes.split(",")}
    async with contextlib.AsyncExitStack() as stack:
        for node in nodes.values():
            await node.start(stack)
        _emit({**_stats(list(nodes.values())), "event": "ready"})
        await _commands(nodes)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._fleetnode")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--nodes", required=True)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--threads", type=int, default=64)
    ns = parser.parse_args()
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    count_request_bytes()
    record_lists()
    inject_relist_rng()
    asyncio.run(amain(ns))


if __name__ == "__main__":
    main()

"""The benchmarks' DRA driver: a FakeDriver whose health stream sends pre-encoded messages.

Run as ``python -m benchmarks._driver --registry DIR --devices N``. It registers
like any driver (the test kit's ``FakeDriver`` serves registration and the DRA
service) but serves ``v1.DRAResourceHealth`` itself with a generic handler that
yields bytes encoded once at start, so the driver's own Python cost does not
bound what the consumer can ingest.

Control: JSON lines on stdin, events as JSON lines on stdout.

- ``{"op": "sweeps", "n": S, "final": P}``: S sweeps over every device, in
  messages of ``--chunk`` devices; sweep k uses pattern 1 + k % 2, the last
  one pattern P. Prints ``{"event": "sent", "t": <wall time>}`` when written.
- ``{"op": "once", "pattern": P}``: one sweep of pattern P.
- ``{"op": "storm", "reports": R, "per_message": K, "rate": X, "seed": S}``
  (optional ``"among": [device indices]``):
  R device reports (see :func:`storm_sequence`) in messages of K, paced at X
  reports a second; ``sent`` carries the first and last send times.
- ``{"op": "steady", "pattern": P, "period": T}``: resend pattern P every T s.
- ``{"op": "flip", "period": T}``: alternate patterns 0 and 3 every T s.
- ``{"op": "quiet"}``: stop a steady or flip loop. ``{"op": "stop"}``: exit.

Patterns (device index i): 0 all Healthy; 1 every third Unhealthy; 2 every
fifth Unhealthy; 3 all Unhealthy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import grpc

from kubelet_dra._proto.dra_health.v1 import api_pb2 as pb
from kubelet_dra.testing import FakeDriver

POOL = "pool"
_HEALTHY, _UNHEALTHY = pb.HEALTHY, pb.UNHEALTHY


def pattern_health(i: int, pattern: int) -> str:
    """The health pattern ``pattern`` gives device ``i`` (as the pod status spells it)."""
    if pattern == 0:
        bad = False
    elif pattern == 1:
        bad = i % 3 == 0
    elif pattern == 2:
        bad = i % 5 == 0
    else:
        bad = True
    return "Unhealthy" if bad else "Healthy"


def sweep_patterns(sweeps: int, final: int) -> list[int]:
    return [final if k == sweeps - 1 else 1 + k % 2 for k in range(sweeps)]


def storm_sequence(
    seed: int, reports: int, devices: int, among: Sequence[int] | None = None
) -> Iterator[tuple[int, str]]:
    """The storm's reports: (device index, health), reproducible from the seed; of the
    devices ``among`` only, if given."""
    rng = random.Random(seed)
    for _ in range(reports):
        device = among[rng.randrange(len(among))] if among else rng.randrange(devices)
        yield device, ("Unhealthy" if rng.random() < 0.5 else "Healthy")


def storm_final(
    seed: int, reports: int, devices: int, base: int = 0, among: Sequence[int] | None = None
) -> dict[int, str]:
    state = {i: pattern_health(i, base) for i in range(devices)}
    for device, health in storm_sequence(seed, reports, devices, among):
        state[device] = health
    return state


def encode(entries: list[tuple[int, str]], lease: int) -> bytes:
    now = int(time.time())
    return pb.NodeWatchResourcesResponse(
        devices=[
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=POOL, device_name=f"dev-{i:06d}"),
                health=_UNHEALTHY if health == "Unhealthy" else _HEALTHY,
                message="XID 79" if health == "Unhealthy" else "",
                last_updated_time=now,
                health_check_timeout_seconds=lease,
            )
            for i, health in entries
        ]
    ).SerializeToString()


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class BenchDriver(FakeDriver):
    """FakeDriver registration and DRA service; a pre-encoded v1 health stream."""

    def __init__(self, *, devices: int, chunk: int, lease: int, **kwargs: Any) -> None:
        super().__init__(
            health_versions=(),
            supported_versions=["v1.DRAPlugin", "v1.DRAResourceHealth"],
            **kwargs,
        )
        self.devices, self.chunk, self.lease = devices, chunk, lease
        self._queues: set[asyncio.Queue[Any]] = set()
        self._patterns: dict[int, list[bytes]] = {}

    def pattern(self, p: int) -> list[bytes]:
        if p not in self._patterns:
            self._patterns[p] = [
                encode(
                    [
                        (i, pattern_health(i, p))
                        for i in range(s, min(s + self.chunk, self.devices))
                    ],
                    self.lease,
                )
                for s in range(0, self.devices, self.chunk)
            ]
        return self._patterns[p]

    def _add_dra_services(self, server: grpc.aio.Server) -> None:
        super()._add_dra_services(server)
        handler = grpc.unary_stream_rpc_method_handler(self._stream)
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "v1.DRAResourceHealth", {"NodeWatchResources": handler}
                ),
            )
        )

    async def _stream(self, request: Any, context: Any) -> AsyncIterator[bytes]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._queues.add(queue)
        emit("stream")
        try:
            while True:
                item = await queue.get()
                if isinstance(item, bytes):
                    yield item
                elif isinstance(item, list):
                    for message in item:
                        yield message
                elif isinstance(item, dict):
                    emit("sent", t=time.time(), **item)
        finally:
            self._queues.discard(queue)

    def put(self, item: Any) -> None:
        for queue in self._queues:
            queue.put_nowait(item)

    async def storm(
        self, reports: int, per_message: int, rate: float, seed: int, among: Any = None
    ) -> None:
        entries = list(storm_sequence(seed, reports, self.devices, among))
        messages = [
            encode(entries[s : s + per_message], self.lease)
            for s in range(0, len(entries), per_message)
        ]
        interval = per_message / rate
        first = time.time()
        start = time.perf_counter()
        for j, message in enumerate(messages):
            delay = start + j * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            self.put(message)
            if j % 64 == 0:
                await asyncio.sleep(0)  # let the stream write while we are behind
        self.put({"first": first})

    async def repeat(self, patterns: list[int], period: float) -> None:
        k = 0
        while True:
            self.put(self.pattern(patterns[k % len(patterns)]))
            k += 1
            await asyncio.sleep(period)


async def control(driver: BenchDriver) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    background: asyncio.Task[None] | None = None
    while line := await reader.readline():
        command = json.loads(line)
        op = command.pop("op")
        if background is not None and op in ("steady", "flip", "quiet", "storm", "stop"):
            background.cancel()
            background = None
        if op == "sweeps":
            patterns = sweep_patterns(int(command["n"]), int(command["final"]))
            driver.put([m for p in patterns for m in driver.pattern(p)])
            driver.put({})
        elif op == "once":
            driver.put(driver.pattern(int(command["pattern"])))
            driver.put({})
        elif op == "storm":
            background = asyncio.create_task(driver.storm(**command))
        elif op == "steady":
            background = asyncio.create_task(
                driver.repeat([int(command["pattern"])], float(command["period"]))
            )
        elif op == "flip":
            background = asyncio.create_task(driver.repeat([3, 0], float(command["period"])))
        elif op == "stop":
            return


async def main_async(ns: argparse.Namespace) -> None:
    driver = BenchDriver(
        name=ns.name, registry=ns.registry, devices=ns.devices, chunk=ns.chunk, lease=ns.lease
    )
    async with driver:
        for p in range(4):
            driver.pattern(p)
        emit("ready", dra_socket=str(driver.dra_socket))
        with contextlib.suppress(asyncio.CancelledError):
            await control(driver)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._driver")
    parser.add_argument("--registry", required=True)
    parser.add_argument("--name", default="gpu.example.com")
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--chunk", type=int, default=100)
    parser.add_argument("--lease", type=int, default=3600)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()

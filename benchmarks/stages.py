"""CPU per stage of ingest and of a restart's state-file load, in-process (issue 15).

``python -m benchmarks.stages [--devices N]`` prints, per device update, the
CPU time (``time.process_time``, every thread of this process: the SQLite
work of a flush runs in sqlitedict's thread) of each stage of the ingest
pipeline, on protobuf responses of 100 devices decoded from the wire as the
stream delivers them, with sweeps alternating two health patterns as the
``ingest`` scenario's driver sends them:

- ``convert``: ``streams.convert`` of every response of a sweep;
- ``cache``: ``HealthCache.update_entries`` of each, staging into the store;
- ``flush``: one ``HealthStore.flush`` of the sweep (every device one row);
- ``floor``: reading every field of every device into a dict, what the
  ``ingest`` scenario's bare-client floor does after decoding.

Then the start-up load of a state file of N devices: ``HealthStore.open``,
``HealthStore.load`` and ``HealthCache.load``, in ms. Medians of the sweeps
after the first (and of three loads). CPU time is steadier than wall time on a
shared machine, but not immune to it: compare two runs made back to back.
No gRPC, no event loop: ``python -m benchmarks --only ingest`` measures those.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import tempfile
import time
from typing import Any

from kubelet_dra import models
from kubelet_dra._proto.dra_health.v1 import api_pb2 as pb
from kubelet_dra.plugin import streams
from kubelet_dra.state import healthinfo, store

CHUNK = 100
SWEEPS = 6


def _responses(devices: int, pattern: int) -> list[Any]:
    out = []
    for start in range(0, devices, CHUNK):
        response = pb.NodeWatchResourcesResponse()
        for i in range(start, min(devices, start + CHUNK)):
            bad = i % 3 == 0 if pattern == 1 else i % 5 == 0
            device = response.devices.add()
            device.device.pool_name = "pool"
            device.device.device_name = f"dev-{i:06d}"
            device.health = 2 if bad else 1
            device.message = "XID 79" if bad else ""
            device.health_check_timeout_seconds = 60
            device.last_updated_time = 1_700_000_000
        # Decoded from bytes, as the stream hands them over.
        out.append(pb.NodeWatchResourcesResponse.FromString(response.SerializeToString()))
    return out


def ingest(devices: int) -> dict[str, float]:
    """Median µs of CPU per device update, per stage."""
    sweeps = [_responses(devices, 1 + k % 2) for k in range(SWEEPS)]
    samples: dict[str, list[float]] = {"convert": [], "cache": [], "flush": [], "floor": []}
    with tempfile.TemporaryDirectory() as tmp:
        db = store.HealthStore.open(pathlib.Path(tmp))
        cache = healthinfo.HealthCache(sink=db)
        now = 1000.0
        for k, sweep in enumerate(sweeps):
            t0 = time.process_time()
            converted = [streams.convert(r.devices, max_devices=CHUNK) for r in sweep]
            t1 = time.process_time()
            for c in converted:
                cache.update_entries("drv", c.entries, now=now, endpoint="/e")
            t2 = time.process_time()
            db.flush()
            t3 = time.process_time()
            seen = {}
            for r in sweep:
                for d in r.devices:
                    seen[(d.device.pool_name, d.device.device_name)] = (
                        d.health, d.message, d.health_check_timeout_seconds, d.last_updated_time,
                    )  # fmt: skip
            t4 = time.process_time()
            now += 0.01
            if k:  # the first sweep creates every record
                for name, a, b in (("convert", t0, t1), ("cache", t1, t2), ("flush", t2, t3),
                                   ("floor", t3, t4)):  # fmt: skip
                    samples[name].append((b - a) / devices * 1e6)
        db.close()
    return {name: statistics.median(v) for name, v in samples.items()}


def load(devices: int) -> dict[str, float]:
    """Median ms of CPU to open, load and cache a state file of ``devices`` devices."""
    samples: dict[str, list[float]] = {"open": [], "load": [], "cache": []}
    with tempfile.TemporaryDirectory() as tmp:
        db = store.HealthStore.open(pathlib.Path(tmp))
        health = models.HealthStatus
        db.stage_many(
            (
                models.DeviceKey("drv", "pool", f"dev-{i:06d}"),
                models.DeviceHealth(
                    health.UNHEALTHY if i % 3 == 0 else health.HEALTHY,
                    "XID 79" if i % 3 == 0 else "",
                    3600.0,
                    time.time(),
                ),
            )
            for i in range(devices)
        )
        db.flush()
        db.close()
        for _ in range(3):
            t0 = time.process_time()
            db = store.HealthStore.open(pathlib.Path(tmp))
            t1 = time.process_time()
            records = db.load()
            t2 = time.process_time()
            with store.gc_paused():  # as the manager loads the cache
                healthinfo.HealthCache().load(records)
            t3 = time.process_time()
            db.close()
            for name, a, b in (("open", t0, t1), ("load", t1, t2), ("cache", t2, t3)):
                samples[name].append((b - a) * 1e3)
    return {name: statistics.median(v) for name, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stages", description=__doc__)
    parser.add_argument("--devices", type=int, action="append", help="default 1,000 and 10,000")
    parser.add_argument("--load", type=int, action="append", help="default 10,000 and 100,000")
    ns = parser.parse_args()
    print("| devices | convert µs | cache µs | flush µs (per row) | floor µs |")
    print("|---|---|---|---|---|")
    for n in ns.devices or [1_000, 10_000]:
        s = ingest(n)
        print(f"| {n:,} | {s['convert']:.2f} | {s['cache']:.2f} | {s['flush']:.2f} | "
              f"{s['floor']:.2f} |")  # fmt: skip
    print("\n| devices in the file | open ms | load ms | cache load ms |")
    print("|---|---|---|---|")
    for n in ns.load or [10_000, 100_000]:
        s = load(n)
        print(f"| {n:,} | {s['open']:.0f} | {s['load']:.0f} | {s['cache']:.0f} |")


if __name__ == "__main__":
    main()

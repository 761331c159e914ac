"""A report storm over many devices and pods ends exact, with writes bounded by the rounds."""

from __future__ import annotations

import asyncio
import random

from kubelet_dra.testing import eventually
from tests.integration import _kube_harness as h

H = h.H
PODS = 40
DEVICES_PER_POD = 5  # 200 devices
REPORTS = 4000


async def test_storm_ends_exact_with_at_most_one_write_per_pod_per_round() -> None:
    async with h.running(write_window=0.02) as t:
        names = [f"p{i}" for i in range(PODS)]
        for i, name in enumerate(names):
            t.pod_with_gpu(name, *(f"gpu-{i}-{d}" for d in range(DEVICES_PER_POD)))
        await eventually(lambda: t.pods.claims_synced, timeout=10)
        rng = random.Random(7)
        final: dict[str, H] = {}
        for n in range(REPORTS):
            device = f"gpu-{rng.randrange(PODS)}-{rng.randrange(DEVICES_PER_POD)}"
            health = rng.choice([H.HEALTHY, H.UNHEALTHY])
            final[device] = health
            t.report(device, health, f"report {n}")
            if n % 200 == 0:
                await asyncio.sleep(0)  # let rounds interleave with the storm
        await h.settled(t, timeout=20)
        for i, name in enumerate(names):
            want = {
                f"{h.DRV}/pool/gpu-{i}-{d}": str(final.get(f"gpu-{i}-{d}", H.UNKNOWN))
                for d in range(DEVICES_PER_POD)
            }
            assert t.healths(name) == want, name
        rounds = t.writer.stats.rounds
        for name in names:
            # Conflicts re-read and re-send inside one round; none are injected here.
            assert len(t.server.status_writes(name=name)) <= rounds
        assert t.writer.stats.results["failed"] == 0

"""SIGKILL of the sidecar at random moments while a driver streams and pods are written.

Each round starts ``kubelet-dra-health run`` as a subprocess against an
in-process FakeDriver and FakeApiServer. Most rounds wait until every pod
shows what the driver reported before the previous kill (the restarted
sidecar recovered), then change the driver's report and the set of pods and
kill the sidecar at a random moment while it streams and writes; about one
round in five kills it during start-up instead (store opening, registration,
first list). After the last round a final sidecar must bring every pod to the
driver's final state. Leases (30 s, renewed every 0.3 s) never run out, so no
status write may ever say ``Unknown`` once the first sidecar has seen the
driver, and the state file must open cleanly after every kill.

Short version: 4 rounds; long: ``KUBELET_DRA_FAULT_ROUNDS`` (default 50).
"""

from __future__ import annotations

import asyncio
import pathlib
import random
import signal
import time

import pytest

from kubelet_dra.testing import FakeApiServer, FakeDriver
from tests.integration._sidecar_process import SidecarProcess

from . import _faults as fx

DEVICES = 6


@pytest.mark.parametrize("rounds", fx.versions(4, per_round=8))
async def test_sigkill_at_random_moments_loses_no_final_state_and_never_blips_unknown(
    sockdir: pathlib.Path, api: FakeApiServer, rounds: int
) -> None:
    rng = random.Random(4680 + rounds)
    world = fx.World(DEVICES, rng)
    for i in range(DEVICES):
        name = f"pod-{i}"
        fx.add_pod(api, name, i)
        world.pods[name] = i
    created = DEVICES
    state = sockdir / "state"
    async with FakeDriver(name=fx.DRIVER, registry=sockdir / "reg") as driver:
        await driver.set_health(*world.reports(timeout=30), resend=0.3)
        async with SidecarProcess(sockdir, api) as first:
            await first.until(lambda: world.converged(api), timeout=20)
            await first.stop(signal.SIGKILL)
        watch_from = time.time()
        logs: list[list[str]] = []
        early_kills = 0
        for _ in range(rounds):
            async with SidecarProcess(sockdir, api) as sidecar:
                if rng.random() < 0.2:
                    early_kills += 1
                    await _random_pause(rng, 1.5)
                else:
                    await sidecar.until(lambda: world.converged(api), timeout=20)
                    world.mutate()
                    created = _churn_pods(api, world, rng, created)
                    await driver.set_health(*world.reports(timeout=30), resend=0.3)
                    # Half the kills land within 50 ms: while the new state is written.
                    await _random_pause(rng, rng.choice((0.05, 0.6)))
                await sidecar.stop(signal.SIGKILL)
            logs.append(list(sidecar.stderr))
            assert not list(state.glob("*.corrupt-*")), "a SIGKILL corrupted the state file"
        async with SidecarProcess(sockdir, api) as last:
            await last.until(lambda: "sidecar running" in last.log, timeout=20)
            await last.until(lambda: world.converged(api), timeout=20)
            code, _ = await last.stop(signal.SIGTERM)
        assert code == 0
        assert "unreadable" not in last.log
    blips = fx.unknown_writes(api, since=watch_from)
    print(
        f"\nSIGKILL of the sidecar: {rounds} rounds ({early_kills} during start-up), "
        f"{len(world.pods)} pods at the end, {len(api.status_writes())} status writes, "
        f"0 lost final states, {len(blips)} Unknown blips"
    )
    assert not blips, (blips[:5], [line for log in logs for line in log if "WARNING" in line])


async def _random_pause(rng: random.Random, most: float) -> None:
    # Chooses the moment of the kill; nothing is asserted on time.
    await asyncio.sleep(rng.uniform(0.0, most))


def _churn_pods(api: FakeApiServer, world: fx.World, rng: random.Random, created: int) -> int:
    """Add a pod holding a random device; remove an old added one now and then."""
    name = f"extra-{created}"
    index = rng.randrange(DEVICES)
    fx.add_pod(api, name, index)
    world.pods[name] = index
    extras = sorted((p for p in world.pods if p.startswith("extra-")), key=lambda p: int(p[6:]))
    if len(extras) > 4:
        gone = extras[0]
        api.delete_pod("default", gone)
        del world.pods[gone]
    return created + 1

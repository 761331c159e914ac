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

After every kill the state file is read as the next sidecar loads it: every
device must keep at least half of its lease across the crash
(``healthinfo.PERSIST_FRACTION``), counted from the driver's last send before
the kill (``FakeDriver.last_sent``), less :data:`SLACK` for a report still on
its way or not yet committed (the flush loop commits every 50 ms here).

Short version: 4 rounds; long: ``KUBELET_DRA_FAULT_ROUNDS`` (default 50).
"""

from __future__ import annotations

import asyncio
import pathlib
import random
import signal
import statistics
import time

import pytest

from kubelet_dra.testing import FakeApiServer, FakeDriver
from tests.integration._sidecar_process import SidecarProcess

from . import _faults as fx

DEVICES = 6
LEASE = 30
SLACK = 3.0
"""Seconds of lease a crash may cost beyond half: the last report's way to the
sidecar, its flush (50 ms here) and a loaded machine. A rule persisting less
often (at full expiry, say) leaves stored copies up to a whole lease old."""


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
        await driver.set_health(*world.reports(timeout=LEASE), resend=0.3)
        left: list[float] = []
        async with SidecarProcess(sockdir, api) as first:
            await first.until(lambda: world.converged(api), timeout=20)
            # Every device committed once, so that a later kill finds each in the file.
            await first.until(lambda: len(fx.stored_deadlines(state)) == DEVICES, timeout=20)
            await _kill(first, driver, state, left)
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
                    await driver.set_health(*world.reports(timeout=LEASE), resend=0.3)
                    # Half the kills land within 50 ms: while the new state is written.
                    await _random_pause(rng, rng.choice((0.05, 0.6)))
                await _kill(sidecar, driver, state, left)
            logs.append(list(sidecar.stderr))
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
        f"0 lost final states, {len(blips)} Unknown blips; lease left in the state file "
        f"after a kill, from the driver's last send: least {min(left):.2f} s, median "
        f"{statistics.median(left):.2f} s of {LEASE} s ({len(left)} devices x kills)"
    )
    assert not blips, (blips[:5], [line for log in logs for line in log if "WARNING" in line])


async def _kill(
    sidecar: SidecarProcess, driver: FakeDriver, state: pathlib.Path, left: list[float]
) -> None:
    """SIGKILL; then every device must keep half its lease in what a restart loads."""
    sent = driver.last_sent
    await sidecar.stop(signal.SIGKILL)
    left.extend(_lease_kept(state, sent))


def _lease_kept(state: pathlib.Path, sent: float | None) -> list[float]:
    """Seconds of lease each device has in the state file after the driver's last send."""
    assert not list(state.glob("*.corrupt-*")), "a SIGKILL corrupted the state file"
    assert sent is not None, "killed before the driver sent anything"
    deadlines = fx.stored_deadlines(state)
    missing = [f"gpu-{i}" for i in range(DEVICES) if f"gpu-{i}" not in deadlines]
    assert not missing, f"devices missing from the state file after a kill: {missing}"
    short = {d: round(t - sent, 2) for d, t in deadlines.items() if t - sent < LEASE / 2 - SLACK}
    assert not short, (
        f"lease left after the crash, counted from the driver's last send (s): {short}; "
        f"each device must keep at least half its {LEASE} s lease (less {SLACK} s)"
    )
    return [t - sent for t in deadlines.values()]


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

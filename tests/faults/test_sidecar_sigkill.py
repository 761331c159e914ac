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
(``healthinfo.PERSIST_FRACTION``), counted from the newest report committed
to the file (every report carries every device, so that is exact and needs
no timing). The lease kept counted from a report the sidecar had applied
(its own ``kubelet_dra_last_report_age_seconds``, scraped after each round's
convergence and before its changes, so the kill still lands at a random
moment) is printed, not asserted: it is shorter by however long a commit was
in flight at the kill, which reached seconds at load 30-44.
"""

from __future__ import annotations

import asyncio
import pathlib
import random
import re
import signal
import statistics
import time

import pytest

from kubelet_dra.testing import FakeApiServer, FakeDriver, eventually
from tests.integration._sidecar_process import SidecarProcess, http_get

from . import _faults as fx

DEVICES = 6
LEASE = 30
_AGE = re.compile(r'^kubelet_dra_last_report_age_seconds\{driver="([^"]+)"\} (\S+)$', re.M)
_COMMITS = re.compile(r"^kubelet_dra_store_commit_duration_seconds_count (\S+)$", re.M)
_COMMITS_1S = re.compile(
    r'^kubelet_dra_store_commit_duration_seconds_bucket\{le="1\.0"\} (\S+)$', re.M
)


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
        async with SidecarProcess(sockdir, api, metrics=True) as first:
            await first.until(lambda: world.converged(api), timeout=20)
            # Every device committed once, so that a later kill finds each in the file.
            await first.until(lambda: len(fx.stored_records(state)) == DEVICES, timeout=20)
            applied, slow = await _applied_report(first)
            slow_commits = [slow]
            await first.stop(signal.SIGKILL)
        kept = [_lease_kept(state, applied)]
        watch_from = time.time()
        logs: list[list[str]] = []
        early_kills = 0
        for _ in range(rounds):
            async with SidecarProcess(sockdir, api, metrics=True) as sidecar:
                if rng.random() < 0.2:
                    early_kills += 1
                    await _random_pause(rng, 1.5)
                else:
                    await sidecar.until(lambda: world.converged(api), timeout=20)
                    seen, slow = await _applied_report(sidecar)
                    applied = max(applied, seen)
                    slow_commits.append(slow)
                    world.mutate()
                    created = _churn_pods(api, world, rng, created)
                    await driver.set_health(*world.reports(timeout=LEASE), resend=0.3)
                    # Half the kills land within 50 ms: while the new state is written.
                    await _random_pause(rng, rng.choice((0.05, 0.6)))
                await sidecar.stop(signal.SIGKILL)
            logs.append(list(sidecar.stderr))
            kept.append(_lease_kept(state, applied))
        async with SidecarProcess(sockdir, api) as last:
            await last.until(lambda: "sidecar running" in last.log, timeout=20)
            await last.until(lambda: world.converged(api), timeout=20)
            code, _ = await last.stop(signal.SIGTERM)
        assert code == 0
        assert "unreadable" not in last.log
    blips = fx.unknown_writes(api, since=watch_from)
    from_commit = [t for committed, _ in kept for t in committed]
    from_applied = [t for _, applied in kept for t in applied]
    print(
        f"\nSIGKILL of the sidecar: {rounds} rounds ({early_kills} during start-up), "
        f"{len(world.pods)} pods at the end, {len(api.status_writes())} status writes, "
        f"0 lost final states, {len(blips)} Unknown blips; lease left in the state file "
        f"after a kill ({len(kept)} kills x {DEVICES} devices), of {LEASE} s: from the newest "
        f"committed report least {min(from_commit):.2f} s, median "
        f"{statistics.median(from_commit):.2f} s; from a report applied before the kill "
        f"least {min(from_applied):.2f} s, median {statistics.median(from_applied):.2f} s, "
        f"under half {sum(t < LEASE / 2 for t in from_applied)} times; "
        f"{sum(slow_commits)} commits over 1 s seen at the scrapes"
    )
    assert not blips, (blips[:5], [line for log in logs for line in log if "WARNING" in line])


async def _applied_report(sidecar: SidecarProcess) -> tuple[float, int]:
    """A lower bound of when the sidecar last applied a report of our driver,
    and how many of its commits so far took over 1 s.

    The scrape's ``now - age``, where that ``now`` is after the request left:
    so the request's send time less the age. Waits for this sidecar's first
    report (a pod may show the driver's state written by an earlier one).
    """
    url = await sidecar.metrics_url()

    async def scrape() -> tuple[float, int]:
        asked = time.time()
        code, body = await http_get(url + "/metrics")
        ages = {driver: float(age) for driver, age in _AGE.findall(body)}
        assert code == 200 and fx.DRIVER in ages, f"no report of {fx.DRIVER} applied yet"
        slow = sum(map(float, _COMMITS.findall(body))) - sum(map(float, _COMMITS_1S.findall(body)))
        return asked - ages[fx.DRIVER], int(slow)

    return await eventually(scrape, what="a report applied (last_report_age_seconds)", timeout=20)


def _lease_kept(state: pathlib.Path, applied: float) -> tuple[list[float], list[float]]:
    """Each device's lease in the state file, counted from the newest committed
    report and from ``applied``; asserts the first is at least half the lease.

    Every report carries every device, so the newest row's report was applied
    to all of them, and the rule left each a copy staged at most half a lease
    older, committed with that row or before it: exact, no timing involved.
    """
    assert not list(state.glob("*.corrupt-*")), "a SIGKILL corrupted the state file"
    records = fx.stored_records(state)
    missing = [f"gpu-{i}" for i in range(DEVICES) if f"gpu-{i}" not in records]
    assert not missing, f"devices missing from the state file after a kill: {missing}"
    committed = max(r.last_report for r in records.values())
    short = {
        d: round(r.deadline - committed, 3)
        for d, r in records.items()
        if r.deadline - committed < LEASE / 2
    }
    assert not short, (
        f"lease left after the crash, counted from the newest committed report (s): {short}; "
        f"each device must keep at least half its {LEASE} s lease"
    )
    return (
        [r.deadline - committed for r in records.values()],
        [r.deadline - applied for r in records.values()],
    )


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

"""The cache against a model of the kubelet v1.37.2 ``updateHealthInfo`` (hypothesis).

:class:`KubeletModel` restates the v1.37.2 rules (reference section 9.1) as plainly as
possible: a per-driver map, the cap on new keys, phase 1 (store the report), phase 2
(delete unreported entries whose timeout passed, announcing those not ``Unknown``),
lazy reads. Driven without our deadline timer (the kubelet has none), the cache must
hold the same records, read the same health and message for every device, and
announce the same devices, except where a declared difference (#140819, eager
expiry) applies: a device whose lease ran out is announced as soon as anyone looks
(here: the next report of any driver), including when a driver-reported ``Unknown``
loses its message; a report that revives an expired device is announced; and the
kubelet's own later announcement of a device we announced early is no extra.

Stream ends are the second declared difference, ``lease-outlives-stream`` (docs/
architecture.md): the kubelet's ``clearDriver`` deletes the driver at once and
announces nothing; we keep each record until its lease runs out or a report renews
it. From a stream end a device of that driver is *diverged* until both caches agree
on it again (present on both sides with the same record, or on neither): meanwhile we
may hold it when the kubelet does not, read its kept state where the kubelet reads
``Unknown``, miss the kubelet's announcement of it reported again unchanged (new to
the kubelet), and refuse a new device the kubelet accepts because the kept records
still count towards the cap (that device is diverged too, until it agrees), or the other
way round: a record the kubelet holds and we do not (we refused it against kept records
that then ran out) counts towards its cap, so it refuses a device we accept. Outside
the diverged devices everything above holds exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubelet_dra import models
from kubelet_dra.state import healthinfo

H = models.HealthStatus
CAP = 4  # small, so the generated reports cross it
DEFAULT = healthinfo.DEFAULT_HEALTH_TIMEOUT


@dataclasses.dataclass
class Entry:
    health: H
    message: str
    timeout: float
    last: float


class KubeletModel:
    def __init__(self) -> None:
        self.drivers: dict[str, dict[tuple[str, str], Entry]] = {}

    def update(
        self, driver: str, reports: list[models.DeviceReport], now: float
    ) -> set[models.DeviceKey]:
        devices = self.drivers.setdefault(driver, {})
        changed: set[models.DeviceKey] = set()
        reported = set()
        for r in reports:
            key = (r.pool, r.device)
            reported.add(key)
            old = devices.get(key)
            if old is None and len(devices) >= CAP:
                continue
            timeout = float(r.timeout_seconds) if r.timeout_seconds > 0 else DEFAULT
            if old is None or (old.health, old.message, old.timeout) != (
                r.health,
                r.message,
                timeout,
            ):
                changed.add(models.DeviceKey(driver, *key))
            devices[key] = Entry(r.health, r.message, timeout, now)
        for key, old in list(devices.items()):
            if key not in reported and now - old.last > old.timeout:
                if old.health is not H.UNKNOWN:
                    changed.add(models.DeviceKey(driver, *key))
                del devices[key]
        return changed

    def clear_driver(self, driver: str) -> None:
        """``clearDriver`` at any stream exit (``HandleWatchResourcesStream``): no notice."""
        self.drivers.pop(driver, None)

    def entry(self, key: models.DeviceKey) -> Entry | None:
        return self.drivers.get(key.driver, {}).get((key.pool, key.device))

    def read(self, key: models.DeviceKey, now: float) -> tuple[H, str]:
        entry = self.drivers.get(key.driver, {}).get((key.pool, key.device))
        if entry is None or now - entry.last > entry.timeout:
            return H.UNKNOWN, ""
        return entry.health, entry.message

    def keys(self) -> set[models.DeviceKey]:
        return {models.DeviceKey(d, *k) for d, devices in self.drivers.items() for k in devices}


reports = st.builds(
    models.DeviceReport,
    pool=st.just("p"),
    device=st.sampled_from([f"d{i}" for i in range(7)]),
    health=st.sampled_from(list(H)),
    message=st.sampled_from(["", "m"]),
    timeout_seconds=st.sampled_from([-1, 0, 1, 2, 5]),
)
steps = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.one_of(st.lists(reports, max_size=8), st.none()),  # None: the stream ends
        st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 6.0, 31.0]),
    ),
    min_size=1,
    max_size=25,
)


@pytest.fixture(autouse=True)
def small_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(healthinfo, "MAX_DEVICES_PER_DRIVER", CAP)


def _agree(cache: healthinfo.HealthCache, model: KubeletModel, key: models.DeviceKey) -> bool:
    ours = dict(cache.records()).get(key)
    theirs = model.entry(key)
    if ours is None or theirs is None:
        return ours is None and theirs is None
    return (ours.health, ours.message, ours.lease, ours.last_report) == (
        theirs.health,
        theirs.message,
        theirs.timeout,
        theirs.last,
    )


@settings(max_examples=300, deadline=None)
@given(steps)
def test_cache_matches_the_kubelet_model(sequence: list[Any]) -> None:
    cache, model = healthinfo.HealthCache(), KubeletModel()
    now = 1_000_000.0
    seen: set[models.DeviceKey] = set()
    early: set[models.DeviceKey] = set()  # announced by us, not yet by the kubelet
    diverged: set[models.DeviceKey] = set()  # lease-outlives-stream (see the docstring)
    orphans: dict[str, set[models.DeviceKey]] = {}  # kept at a stream end, not renewed since
    for driver, batch, gap in sequence:
        now += gap
        if batch is None:
            run_out = {k for k, r in cache.records() if k.driver == driver and r.expired(now)}
            assert set(cache.end_endpoint(driver, driver, now)) <= run_out
            model.clear_driver(driver)
            orphans[driver] = {key for key, _ in cache.records() if key.driver == driver}
            diverged |= orphans[driver]
            diverged = {key for key in diverged if not _agree(cache, model, key)}
            continue
        orphans.pop(driver, None)  # its stream reports again: its records are its own
        # Leases that ran out by now, not announced yet: we announce them
        # whoever looks (here: a report of any driver); the kubelet later, or
        # never (a revival with the same health, a driver-reported Unknown).
        eager = {
            key
            for key, record in cache.records()
            if record.expired(now) and (record.health, record.message) != (H.UNKNOWN, "")
        }
        # A report that revives an expired device is a change for us (readers
        # saw Unknown); the kubelet compares with its stale record.
        revived = {
            key for key, record in cache.records() if record.expired(now) and key.driver == driver
        } & {models.DeviceKey(driver, r.pool, r.device) for r in batch}
        held = {key for key, _ in cache.records() if key.driver == driver} & diverged
        theirs_held = {key for key in set(model.keys()) if key.driver == driver} & diverged
        ours = set(cache.update(driver, batch, now=now, endpoint=driver))
        theirs = model.update(driver, batch, now)
        if held:  # kept records count towards our cap: what we refused and the kubelet took
            diverged |= model.keys() - set(dict(cache.records()))
        if theirs_held:  # and the other way: what the kubelet refused and we took
            diverged |= {key for key, _ in cache.records() if key.driver == driver} - model.keys()
        assert ours - theirs <= eager | revived | diverged  # the declared differences
        assert theirs - ours <= early | diverged  # theirs come later than ours, never instead
        early = (early | (ours & eager)) - theirs
        diverged = {key for key in diverged if not _agree(cache, model, key)}
        assert set(dict(cache.records())) ^ model.keys() <= diverged
        # What a stream end kept goes when its lease runs out (here: at the next
        # report of any driver, which expires leases first).
        stored = dict(cache.records())
        for key in set().union(*orphans.values()):
            assert key not in stored or not stored[key].expired(now), key
        seen |= {models.DeviceKey(driver, r.pool, r.device) for r in batch}
        for key in seen - diverged:
            assert cache.get(key, now).visible(now) == model.read(key, now), key

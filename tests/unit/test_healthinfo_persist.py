"""When the health cache hands records to the store: changes at once, renewals at half lease.

The rule (``healthinfo.PERSIST_FRACTION``): a report that changes a device's
health, message, lease or endpoint is persisted at once; a renewal only when
the persisted record would otherwise expire within half its lease. The
restart guarantee that follows, "a device keeps at least half of its lease
across a crash", is checked last against a real SQLite file, read back by a
second store as a restart after a SIGKILL would.
"""

from __future__ import annotations

import pathlib
import random

import pytest

from kubelet_dra import clock, models
from kubelet_dra.state import healthinfo, store

H = models.HealthStatus
DRV = "drv"
LEASE = 30


class Sink:
    """Records what the cache hands over, report by report."""

    def __init__(self) -> None:
        self.rows: list[tuple[tuple[str, ...], models.DeviceHealth | None]] = []

    def stage(self, key: models.DeviceKey, record: models.DeviceHealth) -> None:
        self.rows.append((tuple(key), record))

    def stage_many(self, records: object) -> None:
        self.rows.extend((tuple(k), r) for k, r in records)  # type: ignore[attr-defined]

    def stage_delete(self, keys: object) -> None:
        self.rows.extend((tuple(k), None) for k in keys)  # type: ignore[attr-defined]

    def take(self) -> list[tuple[tuple[str, ...], models.DeviceHealth | None]]:
        rows, self.rows = self.rows, []
        return rows


def rep(device: str = "dev", health: H = H.HEALTHY, message: str = "", timeout: int = LEASE):
    return models.DeviceReport("pool", device, health, message, timeout)


@pytest.fixture
def fake() -> clock.FakeClock:
    return clock.FakeClock()


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
def cache(sink: Sink) -> healthinfo.HealthCache:
    return healthinfo.HealthCache(sink=sink)


def test_a_renewal_is_persisted_only_once_half_the_lease_is_gone(
    cache: healthinfo.HealthCache, sink: Sink, fake: clock.FakeClock
) -> None:
    persisted_at = []
    for second in range(0, 2 * LEASE + 1):
        cache.update(DRV, [rep()], now=fake.now())
        if sink.take():
            persisted_at.append(second)
        fake.advance(1)
    # New at 0; then each time the stored copy has half its lease (15 s) left.
    assert persisted_at == [0, 15, 30, 45, 60]


def test_a_renewal_after_a_gap_longer_than_half_the_lease_is_persisted(
    cache: healthinfo.HealthCache, sink: Sink, fake: clock.FakeClock
) -> None:
    cache.update(DRV, [rep()], now=fake.now())
    sink.take()
    fake.advance(LEASE / 2 - 0.5)
    cache.update(DRV, [rep()], now=fake.now())
    assert sink.take() == []
    fake.advance(1)  # the stored copy: 15.5 s old, 14.5 s left
    cache.update(DRV, [rep()], now=fake.now())
    assert [r.last_report for _, r in sink.take() if r] == [fake.now()]


@pytest.mark.parametrize(
    ("offset", "persisted"),
    [(-1e-3, False), (0.0, True), (1e-3, True)],
    ids=["just-under-half", "exactly-half", "just-over-half"],
)
@pytest.mark.parametrize("timeout", [0, 2, 30, 300], ids=lambda t: f"timeout-{t}s")
def test_the_boundary_is_half_the_lease_since_the_stored_copy(
    cache: healthinfo.HealthCache,
    sink: Sink,
    fake: clock.FakeClock,
    timeout: int,
    offset: float,
    persisted: bool,
) -> None:
    # timeout 0 is the node default (30 s); the boundary scales with the lease.
    lease = cache.lease_for(timeout)
    stored_at = fake.now()
    cache.update(DRV, [rep(timeout=timeout)], now=stored_at)
    assert len(sink.take()) == 1
    for _ in range(2):  # twice: the second boundary counts from the copy stored at the first
        cache.update(DRV, [rep(timeout=timeout)], now=stored_at + lease / 4)
        assert sink.take() == []
        at = stored_at + lease / 2 + offset
        cache.update(DRV, [rep(timeout=timeout)], now=at)
        rows = sink.take()
        assert [r.last_report for _, r in rows if r] == ([at] if persisted else [])
        if not persisted:
            # A restart now would still load more than half the lease from the old copy.
            assert stored_at + lease - at > lease / 2
            at = stored_at + lease / 2
            cache.update(DRV, [rep(timeout=timeout)], now=at)
            assert [r.last_report for _, r in sink.take() if r] == [at]
        stored_at = at


@pytest.mark.parametrize(
    "changed",
    [
        rep(health=H.UNHEALTHY),
        rep(message="XID 79"),
        rep(timeout=60),
    ],
    ids=["health", "message", "timeout"],
)
def test_a_change_is_persisted_at_once(
    cache: healthinfo.HealthCache,
    sink: Sink,
    fake: clock.FakeClock,
    changed: models.DeviceReport,
) -> None:
    cache.update(DRV, [rep()], now=fake.now())
    sink.take()
    fake.advance(1)
    cache.update(DRV, [changed], now=fake.now())
    rows = sink.take()
    assert len(rows) == 1 and rows[0][1] is not None
    assert rows[0][1][:3] == (changed.health, changed.message, float(changed.timeout_seconds))


def test_a_new_endpoint_is_persisted_at_once(
    cache: healthinfo.HealthCache, sink: Sink, fake: clock.FakeClock
) -> None:
    cache.update(DRV, [rep()], now=fake.now(), endpoint="/old")
    sink.take()
    fake.advance(1)
    cache.update(DRV, [rep()], now=fake.now(), endpoint="/new")
    assert [r.endpoint for _, r in sink.take() if r] == ["/new"]


def test_a_device_reported_after_its_deletion_is_persisted_again(
    cache: healthinfo.HealthCache, sink: Sink, fake: clock.FakeClock
) -> None:
    cache.update(DRV, [rep()], now=fake.now(), endpoint="/e")
    cache.end_endpoint(DRV, "/e", fake.now())  # kept for its lease, then deleted
    fake.advance(LEASE + 1)
    assert cache.expire(fake.now()) == [models.DeviceKey(DRV, "pool", "dev")]
    sink.take()
    fake.advance(1)
    cache.update(DRV, [rep()], now=fake.now(), endpoint="/e")
    assert len(sink.take()) == 1


def test_a_loaded_record_counts_as_persisted(sink: Sink, fake: clock.FakeClock) -> None:
    cache = healthinfo.HealthCache()
    loaded = models.DeviceHealth(H.HEALTHY, "", float(LEASE), fake.now() - 10)
    cache.load([(models.DeviceKey(DRV, "pool", "dev"), loaded)])
    cache.attach(sink)
    cache.update(DRV, [rep()], now=fake.now())
    assert sink.take() == []  # 20 s left on disk
    fake.advance(5)
    cache.update(DRV, [rep()], now=fake.now())
    assert len(sink.take()) == 1  # 15 s left: renewed


def test_without_a_sink_nothing_counts_as_persisted(fake: clock.FakeClock) -> None:
    sink = Sink()
    cache = healthinfo.HealthCache()
    cache.update(DRV, [rep()], now=fake.now())
    cache.attach(sink)
    fake.advance(1)
    cache.update(DRV, [rep()], now=fake.now())
    assert len(sink.take()) == 1  # the first report never reached a store


def test_a_device_keeps_at_least_half_its_lease_across_a_crash(
    tmp_path: pathlib.Path, fake: clock.FakeClock
) -> None:
    rng = random.Random(4680)
    db = store.HealthStore.open(tmp_path)
    cache = healthinfo.HealthCache(sink=db)
    devices = [f"dev{i}" for i in range(8)]
    leases = {d: rng.choice((2, 10, 30, 300)) for d in devices}
    checked = 0
    for _ in range(400):
        fake.advance(rng.uniform(0.05, 3.0))
        reported = rng.sample(devices, rng.randint(1, len(devices)))
        cache.update(
            DRV,
            [
                rep(d, rng.choice((H.HEALTHY, H.HEALTHY, H.UNHEALTHY)), timeout=leases[d])
                for d in reported
            ],
            now=fake.now(),
        )
        db.flush()
        if rng.random() < 0.2:
            # A SIGKILL now: what a restart would load is what is committed.
            checked += _check_restart(tmp_path, cache, fake.now())
    db.close()
    assert checked > 100


def _check_restart(state: pathlib.Path, cache: healthinfo.HealthCache, now: float) -> int:
    reader = store.HealthStore.open(state)
    try:
        on_disk = dict(reader.load())
    finally:
        reader.close()
    checked = 0
    for key, live in cache.records():
        if live.expired(now):
            continue  # Unknown either way
        stored = on_disk[key]
        # Same health, message and lease; the lease from the last report at
        # least half kept.
        assert stored[:3] == live[:3], (key, stored, live)
        assert stored.deadline >= live.last_report + live.lease / 2, (key, stored, live, now)
        checked += 1
    return checked


def test_a_deleted_devices_persist_note_goes_with_it(
    cache: healthinfo.HealthCache, sink: Sink, fake: clock.FakeClock
) -> None:
    # The cache notes when it last handed each device to the store. A note kept past the
    # device's deletion changes no decision (reported again, the device is new and is
    # persisted at once) but would keep every device ever seen in memory.
    cache.update(DRV, [rep("a", timeout=2), rep("b", timeout=2)], now=0.0, endpoint="/e")
    cache.expire(3.0)  # both overdue: the endpoint still streams, so they stay, Unknown
    cache.update(DRV, [rep("b")], now=4.0, endpoint="/e")  # "a" missing: deleted now
    assert cache._persisted == {DRV: {("pool", "b"): 4.0}}
    cache.update("other", [rep("c", timeout=2)], now=4.0, endpoint="/o")
    cache.end_endpoint("other", "/o", now=5.0)
    cache.expire(7.0)  # its stream ended: deleted at the deadline
    assert "other" not in cache._persisted  # the driver's notes go with its last device
    deleted = [key for key, record in sink.take() if record is None]
    assert deleted == [(DRV, "pool", "a"), ("other", "pool", "c")]  # and from the store


def test_devices_reported_before_the_store_was_attached_expire_and_go_cleanly(
    sink: Sink,
) -> None:
    # The manager builds the cache before its state file is open and attaches the file
    # later (HealthCache.attach), so the first reports leave no persist note behind.
    cache = healthinfo.HealthCache()
    cache.update(DRV, [rep("c", timeout=100), rep("a", timeout=2)], now=0.0, endpoint="/e")
    cache.attach(sink)
    cache.expire(3.0)  # "a" ran out; its endpoint streams, so it stays, Unknown, persisted
    assert [(key, record.health) for key, record in sink.take() if record] == [
        ((DRV, "pool", "a"), H.UNKNOWN)
    ]
    assert cache._persisted == {DRV: {("pool", "a"): 0.0}}
    # "c" has no note (reported before the store came); deleting it must not trip on that.
    assert cache.clear_driver(DRV) == [models.DeviceKey(DRV, "pool", "c")]
    assert cache._persisted == {}
    assert sorted(key for key, record in sink.take() if record is None) == [
        (DRV, "pool", "a"),
        (DRV, "pool", "c"),
    ]

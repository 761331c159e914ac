"""Property-based checks of the health cache and its store (hypothesis).

Whatever drivers send (any names, unicode, empty strings, long names, any
timeouts, messages of every length), the cache never raises, its visible
state follows the rules, and what it persists reads back identical and valid.
"""

from __future__ import annotations

import pathlib
import tempfile
from collections.abc import Iterable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubelet_dra import models
from kubelet_dra.state import healthinfo, store

names = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", "/", "a/b", "..", "\x00", "☃", "gpu-0"]),
    st.sampled_from(["x" * 10_000, "é/" * 5_000]),  # 10 kB names
)
reports = st.builds(
    models.DeviceReport,
    pool=names,
    device=names,
    health=st.sampled_from(list(models.HealthStatus)),
    message=st.text(max_size=1100).map(healthinfo.truncate_message),
    timeout_seconds=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    driver_time=st.integers(min_value=-(2**63), max_value=2**63 - 1),
)
steps = st.lists(
    st.tuples(
        st.sampled_from(["drv-a", "drv-b"]), st.lists(reports, max_size=8), st.floats(0, 100)
    ),
    max_size=12,
)


@given(st.text(max_size=1500, alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"])))
def test_truncated_message_is_valid_utf8_within_limit(message: str) -> None:
    out = healthinfo.truncate_message(message)
    assert len(out.encode("utf-8")) <= healthinfo.MESSAGE_MAX_BYTES
    if len(message.encode("utf-8")) <= healthinfo.MESSAGE_MAX_BYTES:
        assert out == message
    else:
        assert out.endswith("...")
        assert message.startswith(out[:-3])


@given(steps)
def test_visible_state_follows_the_last_report_and_its_lease(
    sequence: list[tuple[str, list[models.DeviceReport], float]],
) -> None:
    cache = healthinfo.HealthCache()
    now = 1_000_000.0
    last: dict[models.DeviceKey, tuple[models.DeviceReport, float]] = {}
    for driver, batch, gap in sequence:
        now += gap
        cache.update(driver, batch, now=now, endpoint=driver)
        for report in batch:
            last[models.DeviceKey(driver, report.pool, report.device)] = (report, now)
    for key, (report, at) in last.items():
        lease = cache.lease_for(report.timeout_seconds)
        seen = cache.get(key, now)
        if now - at > lease:
            assert (seen.health, seen.message) == (models.HealthStatus.UNKNOWN, "")
        else:
            assert (seen.health, seen.message) == (report.health, report.message)
        assert lease > 0


class _Tee:
    """A sink handing everything to the store and keeping the latest per device."""

    def __init__(self, db: store.HealthStore, into: dict[object, object]) -> None:
        self.db, self.into = db, into

    def stage(self, key: models.DeviceKey, record: models.DeviceHealth) -> None:
        self.into[key] = record
        self.db.stage(key, record)

    def stage_many(
        self, records: Iterable[tuple[healthinfo.StagedKey, models.DeviceHealth]]
    ) -> None:
        batch = list(records)
        self.into.update(batch)
        self.db.stage_many(batch)

    def stage_delete(self, keys: Iterable[models.DeviceKey]) -> None:
        gone = list(keys)
        self.into.update(dict.fromkeys(gone))
        self.db.stage_delete(gone)


@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(steps)
def test_everything_persisted_reads_back_identical(
    sequence: list[tuple[str, list[models.DeviceReport], float]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = pathlib.Path(tmp)
        db = store.HealthStore.open(state)
        handed: dict[object, object] = {}
        cache = healthinfo.HealthCache(sink=_Tee(db, handed))
        now = 1_000_000.0
        for driver, batch, gap in sequence:
            now += gap
            cache.update(driver, batch, now=now, endpoint=driver)
        db.close()
        reopened = store.HealthStore.open(state)
        # What was handed to the store last per device (renewals only at half
        # lease, healthinfo.PERSIST_FRACTION), and nothing deleted, reads back.
        assert dict(reopened.load()) == {k: r for k, r in handed.items() if r is not None}
        assert dict(reopened.load()).keys() == dict(cache.records()).keys()
        assert reopened.skipped_rows == 0
        reopened.close()


@settings(deadline=None)  # a first example took 257 ms at load 40 (0.2 ms when repeated)
@given(st.lists(st.floats(0, 50), min_size=1, max_size=30), st.integers(1, 40))
def test_expire_reports_each_lease_exactly_once_at_its_deadline(
    offsets: list[float], timeout: int
) -> None:
    cache = healthinfo.HealthCache()
    t0 = 1_000_000.0
    expired: list[models.DeviceKey] = []
    reported_at: dict[str, float] = {}

    def run_deadlines(until: float) -> None:
        # What the manager's deadline loop does: wake at each deadline.
        while (deadline := cache.next_deadline()) is not None and deadline < until:
            now = deadline + 1e-6
            for key in cache.expire(now):
                assert timeout < now - reported_at[key.device] <= timeout + 1e-3
                expired.append(key)

    for i, offset in enumerate(sorted(offsets)):
        run_deadlines(t0 + offset)
        reported_at[f"d{i}"] = t0 + offset
        report = models.DeviceReport("p", f"d{i}", models.HealthStatus.HEALTHY, "", timeout)
        assert cache.update("drv", [report], now=t0 + offset) == [
            models.DeviceKey("drv", "p", f"d{i}")
        ]
    run_deadlines(float("inf"))
    assert sorted(expired) == sorted(models.DeviceKey("drv", "p", d) for d in reported_at)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_keyed_entries_apply_as_reports_without_duplicates(
    sequence: list[tuple[str, list[models.DeviceReport], float]],
) -> None:
    # The stream's path (update_entries, each device once, last wins) and the
    # report path (update) must agree on what changed, what is held and what
    # is staged, whenever the report names each device once.
    by_reports, by_entries = healthinfo.HealthCache(), healthinfo.HealthCache()
    staged: tuple[dict[object, object], dict[object, object]] = ({}, {})

    class Sink:
        def __init__(self, into: dict[object, object]) -> None:
            self.into = into

        def stage(self, key: models.DeviceKey, record: models.DeviceHealth) -> None:
            self.into[key] = record

        def stage_many(self, records: object) -> None:
            self.into.update(records)  # type: ignore[call-overload]

        def stage_delete(self, keys: object) -> None:
            self.into.update(dict.fromkeys(keys))  # type: ignore[call-overload]

    by_reports.attach(Sink(staged[0]))
    by_entries.attach(Sink(staged[1]))
    now = 1_000_000.0
    for driver, batch, gap in sequence:
        now += gap
        unique = list({(r.pool, r.device): r for r in batch}.values())
        entries = {(r.pool, r.device): tuple(r[2:]) for r in unique}
        ours = by_reports.update(driver, unique, now=now, endpoint="/e")
        theirs = by_entries.update_entries(driver, entries, now=now, endpoint="/e")  # type: ignore[arg-type]
        assert ours == theirs
        assert all(type(key) is models.DeviceKey for key in theirs)
        assert list(by_reports.records()) == list(by_entries.records())
        assert by_reports.refused == by_entries.refused
    assert staged[0] == staged[1]

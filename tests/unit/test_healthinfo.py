"""Health cache semantics: the kubelet's healthinfo_test.go scenarios, and what we do better.

Upstream scenarios (reference section 6.1) are tables below; the kubelet tests
move ``LastUpdated`` back in time, here time moves forward instead (``now``
is an argument).
"""

from __future__ import annotations

import pytest

from kubelet_dra import models
from kubelet_dra.state import healthinfo

H = models.HealthStatus
T0 = 1_000_000.0
DRV = "test-driver"


def rep(device: str, health: H, *, pool: str = "pool", timeout: int = 0, message: str = ""):
    return models.DeviceReport(pool, device, health, message, timeout)


def key(device: str, pool: str = "pool") -> models.DeviceKey:
    return models.DeviceKey(DRV, pool, device)


@pytest.fixture
def cache() -> healthinfo.HealthCache:
    return healthinfo.HealthCache()


# -- TestGetHealthInfo / TestGetHealthInfoRobust ------------------------------


@pytest.mark.parametrize(
    ("reports", "query", "age", "expected"),
    [
        ([], key("dev"), 0, H.UNKNOWN),
        ([rep("dev", H.HEALTHY)], key("dev"), 0, H.HEALTHY),
        ([rep("dev", H.UNHEALTHY)], key("dev"), 0, H.UNHEALTHY),
        ([rep("dev", H.HEALTHY)], key("dev"), 31, H.UNKNOWN),
        ([rep("dev", H.HEALTHY)], key("dev"), 29, H.HEALTHY),
        ([rep("dev", H.HEALTHY)], key("dev"), 30, H.HEALTHY),  # strictly greater expires
        ([rep("dev", H.HEALTHY)], key("other"), 0, H.UNKNOWN),
        ([rep("dev", H.HEALTHY)], key("other"), 31, H.UNKNOWN),
        ([rep("dev", H.HEALTHY)], models.DeviceKey("nope", "pool", "dev"), 0, H.UNKNOWN),
        ([rep("dev", H.HEALTHY)], key("dev", pool="nope"), 0, H.UNKNOWN),
        ([rep("a", H.HEALTHY), rep("b", H.UNHEALTHY)], key("b"), 0, H.UNHEALTHY),
    ],
    ids=[
        "empty-unknown",
        "fresh-healthy",
        "fresh-unhealthy",
        "stale-31s-unknown",
        "fresh-29s-healthy",
        "exactly-30s-still-valid",
        "other-device-unknown",
        "other-device-stale-unknown",
        "unknown-driver",
        "unknown-pool",
        "two-devices-query-unhealthy",
    ],
)
def test_get_health_info(
    cache: healthinfo.HealthCache,
    reports: list[models.DeviceReport],
    query: models.DeviceKey,
    age: float,
    expected: H,
) -> None:
    cache.update(DRV, reports, now=T0)
    assert cache.get(query, T0 + age).health is expected


def test_expired_device_reads_unknown_with_empty_message(cache: healthinfo.HealthCache) -> None:
    cache.update(DRV, [rep("dev", H.UNHEALTHY, message="ECC")], now=T0)
    assert cache.get(key("dev"), T0 + 31).message == ""


# -- TestUpdateHealthInfo, step by step ---------------------------------------


def test_update_health_info_sequence(tmp_path) -> None:
    from kubelet_dra.state import store

    db = store.HealthStore.open(tmp_path)
    cache = healthinfo.HealthCache(sink=db)
    # (1) new Healthy device => changed.
    assert cache.update(DRV, [rep("device1", H.HEALTHY)], now=T0) == [key("device1")]
    assert cache.get(key("device1"), T0).health is H.HEALTHY
    # (2) the same report again => no change.
    assert cache.update(DRV, [rep("device1", H.HEALTHY)], now=T0 + 1) == []
    # (3) Unhealthy => changed.
    assert cache.update(DRV, [rep("device1", H.UNHEALTHY)], now=T0 + 2) == [key("device1")]
    # (4) 60 s later only device2 is reported => device2 new, device1 Unknown
    # (and, since v1.37.2, deleted: it is not reported and its lease ran out).
    changed = cache.update(DRV, [rep("device2", H.HEALTHY)], now=T0 + 62)
    assert set(changed) == {key("device1"), key("device2")}
    assert cache.get(key("device1"), T0 + 62).health is H.UNKNOWN
    assert key("device1") not in dict(cache.records())
    db.flush()
    db.close()
    # (5) a new cache from the same file => device2 Healthy, device1 Unknown.
    reopened = store.HealthStore.open(tmp_path)
    fresh = healthinfo.HealthCache(sink=reopened)
    fresh.load(reopened.load())
    assert fresh.get(key("device2"), T0 + 63).health is H.HEALTHY
    assert fresh.get(key("device1"), T0 + 63).health is H.UNKNOWN
    # (6) timeoutDevice Unhealthy, 31 s pass, an empty report => it turns Unknown.
    fresh.update(DRV, [rep("timeoutDevice", H.UNHEALTHY)], now=T0 + 70)
    fresh.update(DRV, [rep("device2", H.HEALTHY)], now=T0 + 95)
    assert fresh.update(DRV, [], now=T0 + 101) == [key("timeoutDevice")]
    # v1.37.2: the stale entry is deleted after its Unknown notification; a
    # missing entry reads Unknown.
    assert key("timeoutDevice") not in dict(fresh.records())
    assert fresh.get(key("timeoutDevice"), T0 + 101).health is H.UNKNOWN
    reopened.close()


def test_clear_driver_deletes_devices(cache: healthinfo.HealthCache) -> None:
    cache.update(DRV, [rep("dev", H.HEALTHY)], now=T0)
    assert cache.clear_driver(DRV, T0 + 1) == [key("dev")]
    assert cache.get(key("dev"), T0 + 1).health is H.UNKNOWN
    assert list(cache.records()) == []
    assert cache.drivers() == []


# -- report semantics ----------------------------------------------------------


@pytest.mark.parametrize(
    ("timeout", "lease"),
    [(12, 12.0), (0, 30.0), (-1, 30.0), (3600, 3600.0)],
    ids=["positive-wins", "zero-default", "negative-default", "long"],
)
def test_lease_is_positive_timeout_else_default(
    cache: healthinfo.HealthCache, timeout: int, lease: float
) -> None:
    cache.update(DRV, [rep("dev", H.HEALTHY, timeout=timeout)], now=T0)
    assert cache.get(key("dev"), T0).lease == lease
    assert cache.get(key("dev"), T0 + lease).health is H.HEALTHY
    assert cache.get(key("dev"), T0 + lease + 0.001).health is H.UNKNOWN


def test_configured_default_lease_applies() -> None:
    cache = healthinfo.HealthCache(default_lease=5)
    cache.update(DRV, [rep("dev", H.HEALTHY)], now=T0)
    assert cache.get(key("dev"), T0 + 5.5).health is H.UNKNOWN


@pytest.mark.parametrize(
    ("second", "changed"),
    [
        (rep("dev", H.HEALTHY, message="ok"), False),
        (rep("dev", H.UNHEALTHY, message="ok"), True),
        (rep("dev", H.HEALTHY, message="different"), True),
        (rep("dev", H.HEALTHY, message="ok", timeout=99), True),
    ],
    ids=["identical", "health", "message", "lease"],
)
def test_change_detection_covers_health_message_and_lease(
    cache: healthinfo.HealthCache, second: models.DeviceReport, changed: bool
) -> None:
    cache.update(DRV, [rep("dev", H.HEALTHY, message="ok")], now=T0)
    assert bool(cache.update(DRV, [second], now=T0 + 1)) is changed


def test_report_restarts_lease_at_receive_time_not_driver_time(
    cache: healthinfo.HealthCache,
) -> None:
    old = models.DeviceReport("pool", "dev", H.HEALTHY, driver_time=int(T0) - 10_000)
    cache.update(DRV, [old], now=T0)
    record = cache.get(key("dev"), T0 + 29)
    assert record.health is H.HEALTHY
    assert record.last_report == T0
    assert record.driver_time == int(T0) - 10_000


def test_duplicate_device_in_one_report_last_wins(cache: healthinfo.HealthCache) -> None:
    changed = cache.update(DRV, [rep("dev", H.HEALTHY), rep("dev", H.UNHEALTHY)], now=T0)
    assert changed == [key("dev")]
    assert cache.get(key("dev"), T0).health is H.UNHEALTHY


def test_report_reviving_an_expired_device_is_a_change(cache: healthinfo.HealthCache) -> None:
    # The kubelet compares with the stale stored record and sees no change,
    # so the pod keeps showing Unknown; we compare with what readers saw.
    cache.update(DRV, [rep("dev", H.HEALTHY)], now=T0)
    assert cache.update(DRV, [rep("dev", H.HEALTHY)], now=T0 + 40) == [key("dev")]


# -- message truncation (TestTruncateHealthMessage) ---------------------------


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("", ""),
        ("short", "short"),
        ("a" * 1024, "a" * 1024),
        ("a" * 1025, "a" * 1021 + "..."),
        ("a" * 2048, "a" * 1021 + "..."),
    ],
    ids=["empty", "short", "exactly-1024", "1025", "2048"],
)
def test_truncate_health_message(message: str, expected: str) -> None:
    assert healthinfo.truncate_message(message) == expected


@pytest.mark.parametrize("prefix", range(1016, 1025))
@pytest.mark.parametrize("char", ["é", "€", "𝄞"], ids=["2-byte", "3-byte", "4-byte"])
def test_truncation_never_splits_a_utf8_character(prefix: int, char: str) -> None:
    message = "a" * prefix + char * 10
    out = healthinfo.truncate_message(message)
    raw = out.encode("utf-8")
    assert len(raw) <= 1024
    if len(message.encode()) > 1024:
        assert out.endswith("...")
        assert message.startswith(out[:-3])
        assert len(raw) > 1024 - 3 - len(char.encode())  # only the partial character dropped
    else:
        assert out == message


# -- beyond the kubelet: deadlines -----------------------------------------------


def test_next_deadline_is_earliest_live_lease(cache: healthinfo.HealthCache) -> None:
    assert cache.next_deadline() is None
    cache.update(DRV, [rep("a", H.HEALTHY, timeout=10), rep("b", H.HEALTHY, timeout=5)], now=T0)
    assert cache.next_deadline() == T0 + 5
    cache.update(DRV, [rep("b", H.HEALTHY, timeout=5)], now=T0 + 4)  # a renewal
    # A lower bound until settled: nothing expires at the old deadline, and
    # the next deadline is then the renewed one.
    assert cache.next_deadline() == T0 + 5
    assert cache.expire(T0 + 5.01) == []
    assert cache.next_deadline() == T0 + 9


def test_expire_returns_devices_at_their_deadline(cache: healthinfo.HealthCache) -> None:
    cache.update(DRV, [rep("a", H.HEALTHY, timeout=10), rep("b", H.UNHEALTHY, timeout=5)], now=T0)
    assert cache.expire(T0 + 5) == []
    assert cache.expire(T0 + 5.01) == [key("b")]
    assert cache.get(key("b"), T0 + 5.01).health is H.UNKNOWN
    assert cache.next_deadline() == T0 + 10
    assert cache.expire(T0 + 100) == [key("a")]
    assert cache.next_deadline() is None
    assert cache.expire(T0 + 200) == []


def test_renewed_lease_does_not_expire_at_old_deadline(cache: healthinfo.HealthCache) -> None:
    cache.update(DRV, [rep("a", H.HEALTHY, timeout=10)], now=T0)
    cache.update(DRV, [rep("a", H.HEALTHY, timeout=10)], now=T0 + 8)
    assert cache.expire(T0 + 11) == []
    assert cache.expire(T0 + 18.5) == [key("a")]


def test_driver_reported_unknown_with_message_expires_to_plain_unknown(
    cache: healthinfo.HealthCache,
) -> None:
    cache.update(DRV, [rep("a", H.UNKNOWN, timeout=5, message="NVML lost")], now=T0)
    assert cache.expire(T0 + 6) == [key("a")]
    assert cache.get(key("a"), T0 + 6).message == ""


# -- beyond the kubelet: the lease outlives the stream ---------------------------
# The kubelet's clearDriver deletes a driver's devices when any of its streams
# ends (kubernetes #140818); here they keep their state until their lease runs
# out, and go then. Each test fails on the old rule (delete the endpoint's
# devices at the stream end and announce them).


def test_stream_end_changes_nothing_until_the_lease_runs_out(
    cache: healthinfo.HealthCache,
) -> None:
    cache.update(DRV, [rep("a", H.UNHEALTHY, message="ECC")], now=T0, endpoint="e")
    assert cache.end_endpoint(DRV, "e", T0 + 1) == []
    assert cache.get(key("a"), T0 + 30).visible(T0 + 30) == (H.UNHEALTHY, "ECC")
    assert cache.next_deadline() == T0 + 30
    assert cache.expire(T0 + 30) == []
    # The driver never came back: Unknown exactly at the deadline, announced
    # then, and the record goes with it (nothing stays of a vanished driver).
    assert cache.expire(T0 + 30.01) == [key("a")]
    assert cache.get(key("a"), T0 + 30.01) == models.UNKNOWN_DEVICE
    assert list(cache.records()) == []
    assert cache.drivers() == []
    assert cache.next_deadline() is None


def test_driver_restarted_within_the_lease_changes_nothing(
    cache: healthinfo.HealthCache,
) -> None:
    cache.update(DRV, [rep("a", H.UNHEALTHY, message="ECC")], now=T0, endpoint="e")
    assert cache.end_endpoint(DRV, "e", T0 + 1) == []
    # The restarted driver, on the same socket, says the same: no change.
    assert cache.update(DRV, [rep("a", H.UNHEALTHY, message="ECC")], now=T0 + 4, endpoint="e") == []
    assert cache.expire(T0 + 30.01) == []  # renewed at T0 + 4
    assert cache.get(key("a"), T0 + 34).health is H.UNHEALTHY


def test_driver_restarted_after_the_lease_is_unknown_at_the_deadline_then_back(
    cache: healthinfo.HealthCache,
) -> None:
    cache.update(DRV, [rep("a", H.UNHEALTHY)], now=T0, endpoint="e")
    cache.end_endpoint(DRV, "e", T0 + 1)
    assert cache.expire(T0 + 30.01) == [key("a")]
    assert cache.update(DRV, [rep("a", H.UNHEALTHY)], now=T0 + 45, endpoint="e") == [key("a")]
    assert cache.get(key("a"), T0 + 45).health is H.UNHEALTHY


def test_rolling_upgrade_new_endpoint_takes_over_the_rest_keep_their_lease(
    cache: healthinfo.HealthCache,
) -> None:
    cache.update(DRV, [rep("a", H.HEALTHY), rep("b", H.HEALTHY)], now=T0, endpoint="old")
    cache.update(DRV, [rep("a", H.HEALTHY)], now=T0 + 1, endpoint="new")
    assert cache.end_endpoint(DRV, "old", T0 + 2) == []
    assert cache.get(key("b"), T0 + 2).health is H.HEALTHY
    # b (only the old endpoint had it) runs out and goes; a belongs to "new".
    assert cache.expire(T0 + 30.01) == [key("b")]
    assert set(dict(cache.records())) == {key("a")}
    # a's own lease runs out while "new" streams: Unknown, kept for the
    # driver's next report to delete (the kubelet v1.37.2 rule).
    assert cache.expire(T0 + 31.01) == [key("a")]
    assert key("a") in dict(cache.records())
    cache.update(DRV, [], now=T0 + 32, endpoint="new")
    assert list(cache.records()) == []


def test_stream_end_touches_only_its_driver(cache: healthinfo.HealthCache) -> None:
    cache.update(DRV, [rep("a", H.HEALTHY)], now=T0, endpoint="e")
    cache.update("other", [rep("a", H.HEALTHY)], now=T0, endpoint="e")
    assert cache.end_endpoint(DRV, "e", T0 + 1) == []
    assert set(cache.expire(T0 + 31)) == {key("a"), models.DeviceKey("other", "pool", "a")}
    # Only the ended driver's record is deleted; the other one's stream runs.
    assert set(dict(cache.records())) == {models.DeviceKey("other", "pool", "a")}


def test_driver_reported_unknown_of_an_ended_stream_goes_silently_at_its_lease(
    cache: healthinfo.HealthCache,
) -> None:
    cache.update(DRV, [rep("u", H.UNKNOWN, timeout=5)], now=T0, endpoint="e")
    cache.end_endpoint(DRV, "e", T0 + 1)
    assert cache.expire(T0 + 6) == []  # it read Unknown already
    assert list(cache.records()) == []


def test_stream_end_deletes_the_endpoints_records_whose_lease_already_ran_out(
    cache: healthinfo.HealthCache,
) -> None:
    cache.update(DRV, [rep("a", H.HEALTHY, timeout=5), rep("b", H.HEALTHY)], now=T0, endpoint="e")
    assert cache.expire(T0 + 6) == [key("a")]  # the stream runs: a kept, Unknown
    assert key("a") in dict(cache.records())
    assert cache.end_endpoint(DRV, "e", T0 + 7) == []
    assert set(dict(cache.records())) == {key("b")}


def test_stream_end_announces_a_run_out_lease_the_timer_has_not_seen(
    cache: healthinfo.HealthCache,
) -> None:
    cache.update(DRV, [rep("a", H.HEALTHY, timeout=5)], now=T0, endpoint="e")
    assert cache.end_endpoint(DRV, "e", T0 + 6) == [key("a")]
    assert list(cache.records()) == []


def test_loaded_records_go_at_their_lease_unless_their_endpoint_reports(
    cache: healthinfo.HealthCache,
) -> None:
    record = models.DeviceHealth(H.UNHEALTHY, "ECC", 30.0, T0, endpoint="e")
    cache.load(
        [(key("a"), record), (key("b"), record), (key("c"), record._replace(endpoint="gone"))]
    )
    cache.update(DRV, [rep("a", H.UNHEALTHY, message="ECC")], now=T0 + 5, endpoint="e")
    assert set(cache.expire(T0 + 30.01)) == {key("b"), key("c")}
    # b's endpoint streams again: kept (Unknown) for the driver's next report;
    # c's never reported since the restart: gone.
    assert set(dict(cache.records())) == {key("a"), key("b")}


def test_invalid_default_lease_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        healthinfo.HealthCache(default_lease=0)


# -- kubelet v1.37.2: the per-driver cap ---------------------------------------

CAP = healthinfo.MAX_DEVICES_PER_DRIVER


def many(count: int, *, start: int = 0, health: H = H.HEALTHY) -> list[models.DeviceReport]:
    return [rep(f"device-{i}", health) for i in range(start, start + count)]


@pytest.mark.parametrize(
    ("count", "kept", "refused"),
    [(CAP - 1, CAP - 1, 0), (CAP, CAP, 0), (CAP + 1, CAP, 1), (CAP + 100, CAP, 100)],
    ids=["below-cap", "exactly-at-cap", "cap+1", "cap+100"],
)
def test_new_devices_beyond_the_cap_are_refused(
    cache: healthinfo.HealthCache, caplog, count: int, kept: int, refused: int
) -> None:
    changed = cache.update(DRV, many(count), now=T0)
    assert len(changed) == kept
    assert len(cache) == kept
    assert cache.refused[DRV] == refused
    # The first devices of the report are kept, as the kubelet's loop does.
    assert cache.get(key(f"device-{kept - 1}"), T0).health is H.HEALTHY
    assert cache.get(key(f"device-{kept}"), T0).health is H.UNKNOWN
    cap_lines = [r for r in caplog.records if "per driver" in r.getMessage()]
    assert len(cap_lines) == (1 if refused else 0)  # one line per report, with the count
    if refused:
        assert f"ignored {refused} new devices" in cap_lines[0].getMessage()


def test_known_devices_are_updated_at_the_cap(cache: healthinfo.HealthCache) -> None:
    cache.update(DRV, many(CAP), now=T0)
    # A new name is refused; a known one beyond the refused one is still updated.
    changed = cache.update(
        DRV, [rep("one-too-many", H.HEALTHY), rep("device-0", H.UNHEALTHY)], now=T0 + 1
    )
    assert changed == [key("device-0")]
    assert cache.get(key("device-0"), T0 + 1).health is H.UNHEALTHY
    assert cache.get(key("one-too-many"), T0 + 1).health is H.UNKNOWN
    assert cache.refused[DRV] == 1
    assert len(cache) == CAP


def test_the_cap_is_per_driver(cache: healthinfo.HealthCache) -> None:
    cache.update(DRV, many(CAP), now=T0)
    assert cache.update("other", [rep("device-0", H.HEALTHY)], now=T0) == [
        models.DeviceKey("other", "pool", "device-0")
    ]
    assert cache.refused["other"] == 0


def test_overdue_records_count_towards_the_cap_until_deleted(
    cache: healthinfo.HealthCache,
) -> None:
    # The kubelet stores the report before it deletes stale entries, so a
    # full driver refuses new names in the report that deletes the old ones.
    cache.update(DRV, many(CAP), now=T0)
    fresh = many(5, start=CAP)
    assert len(cache.update(DRV, fresh, now=T0 + 31)) == CAP  # only the Unknown transitions
    assert cache.refused[DRV] == 5
    assert len(cache) == 0  # every stale record deleted
    assert len(cache.update(DRV, fresh, now=T0 + 32)) == 5  # room again
    assert len(cache) == 5


def test_records_of_an_ended_stream_count_towards_the_cap_until_their_lease_ends(
    cache: healthinfo.HealthCache,
) -> None:
    # A deliberate difference: the kubelet's clearDriver frees the cap at the
    # stream end; here the records it keeps are held until their leases end.
    cache.update(DRV, many(CAP), now=T0, endpoint="e")
    cache.end_endpoint(DRV, "e", T0 + 1)
    assert cache.update(DRV, many(3, start=CAP), now=T0 + 2, endpoint="e2") == []
    assert cache.refused[DRV] == 3
    assert len(cache.expire(T0 + 30.01)) == CAP  # announced and deleted
    assert len(cache) == 0
    assert len(cache.update(DRV, many(3, start=CAP), now=T0 + 31, endpoint="e2")) == 3


# -- kubelet v1.37.2: stale entries are deleted --------------------------------


def test_stale_entries_are_announced_once_then_deleted(cache: healthinfo.HealthCache) -> None:
    # TestUpdateHealthInfoStaleEntryRemoval, with time moving forward.
    cache.update(
        DRV,
        [rep("healthy-stale", H.HEALTHY), rep("unknown-stale", H.UNKNOWN), rep("fresh", H.HEALTHY)],
        now=T0,
    )
    assert cache.update(DRV, [rep("fresh", H.HEALTHY)], now=T0 + 20) == []  # renews "fresh"
    # 31 s: the other two ran out; a report of "fresh" deletes them.
    changed = cache.update(DRV, [rep("fresh", H.HEALTHY)], now=T0 + 31)
    assert changed == [key("healthy-stale")]  # the Unknown one goes silently
    assert set(dict(cache.records())) == {key("fresh")}
    assert cache.get(key("healthy-stale"), T0 + 31) == models.UNKNOWN_DEVICE
    # Announced once: later reports change nothing.
    assert cache.update(DRV, [rep("fresh", H.HEALTHY)], now=T0 + 32) == []


@pytest.mark.parametrize(
    ("steps", "deleted_at", "announced"),
    [
        # (time, devices of a report or None for no report, run the deadline timer first?)
        ([(29, ["b"], False), (30, ["b"], False)], None, []),  # lease not run out: kept
        ([(31, ["b"], False)], 31, [31]),  # no timer ran: announced with the deletion
        ([(31, ["b"], True)], 31, [31]),  # the timer announced it at the deadline
        ([(31, None, True), (40, ["b"], False)], 40, [31]),  # deleted at the next report
        ([(31, ["a"], True)], None, [31]),  # reported again: revived, not deleted
    ],
    ids=["within-lease", "lazy", "timer-then-report", "timer-then-later-report", "revived"],
)
def test_deletion_composes_with_eager_expiry(
    cache: healthinfo.HealthCache,
    steps: list[tuple[float, list[str] | None, bool]],
    deleted_at: float | None,
    announced: list[float],
) -> None:
    cache.update(DRV, [rep("a", H.HEALTHY), rep("b", H.HEALTHY)], now=T0)
    seen: list[float] = []
    for at, names, timer in steps:
        if timer and key("a") in cache.expire(T0 + at):
            seen.append(at)
        if names is not None:
            changed = cache.update(DRV, [rep(n, H.HEALTHY) for n in names], now=T0 + at)
            if key("a") in changed and "a" not in names:
                seen.append(at)
        present = key("a") in dict(cache.records())
        assert present is (deleted_at is None or at < deleted_at), at
    assert seen == announced


def test_driver_reported_unknown_is_deleted_after_its_lease(
    cache: healthinfo.HealthCache,
) -> None:
    cache.update(DRV, [rep("u", H.UNKNOWN, timeout=5), rep("k", H.HEALTHY, timeout=60)], now=T0)
    assert cache.update(DRV, [rep("k", H.HEALTHY, timeout=60)], now=T0 + 5) == []
    assert key("u") in dict(cache.records())  # exactly at the lease: kept
    assert cache.update(DRV, [rep("k", H.HEALTHY, timeout=60)], now=T0 + 5.5) == []
    assert key("u") not in dict(cache.records())
    # A deleted device reported again is new, so a change (as in the kubelet).
    assert cache.update(DRV, [rep("u", H.UNKNOWN, timeout=5)], now=T0 + 6) == [key("u")]


def test_deletion_waits_for_a_report_of_the_same_driver(cache: healthinfo.HealthCache) -> None:
    cache.update(DRV, [rep("a", H.HEALTHY)], now=T0)
    cache.update("other", [rep("x", H.HEALTHY, timeout=600)], now=T0)
    assert cache.expire(T0 + 31) == [key("a")]
    cache.update("other", [rep("x", H.HEALTHY, timeout=600)], now=T0 + 40)
    assert key("a") in dict(cache.records())  # still there, Unknown
    assert cache.get(key("a"), T0 + 40).health is H.UNKNOWN
    cache.update(DRV, [], now=T0 + 41)
    assert key("a") not in dict(cache.records())


def test_deletion_is_persisted_across_a_store_reopen(tmp_path) -> None:
    from kubelet_dra.state import store

    db = store.HealthStore.open(tmp_path)
    cache = healthinfo.HealthCache(sink=db)
    cache.update(DRV, [rep("gone", H.UNHEALTHY, message="XID"), rep("kept", H.HEALTHY)], now=T0)
    db.flush()
    cache.update(DRV, [rep("kept", H.HEALTHY)], now=T0 + 20)
    assert cache.update(DRV, [rep("kept", H.HEALTHY)], now=T0 + 40) == [key("gone")]
    db.flush()
    db.close()
    reopened = store.HealthStore.open(tmp_path)
    rows = dict(reopened.load())
    assert set(rows) == {key("kept")}  # the row is gone from the file
    fresh = healthinfo.HealthCache(sink=reopened)
    fresh.load(rows.items())
    assert fresh.get(key("gone"), T0 + 41) == models.UNKNOWN_DEVICE
    assert fresh.get(key("kept"), T0 + 41).health is H.HEALTHY
    reopened.close()


def test_an_expired_record_loaded_at_restart_is_deleted_at_start(tmp_path) -> None:
    from kubelet_dra.state import store

    db = store.HealthStore.open(tmp_path)
    cache = healthinfo.HealthCache(sink=db)
    cache.update(DRV, [rep("a", H.UNKNOWN), rep("b", H.HEALTHY)], now=T0)
    db.close()
    reopened = store.HealthStore.open(tmp_path)
    fresh = healthinfo.HealthCache(sink=reopened)
    fresh.load(reopened.load())
    assert set(fresh.expire(T0 + 100)) == {key("b")}  # what the sidecar does at start
    # No stream of their endpoint ran since the restart: both go at once.
    assert list(fresh.records()) == []
    assert fresh.update(DRV, [], now=T0 + 101) == []
    reopened.close()
    again = store.HealthStore.open(tmp_path)
    assert again.load() == []
    again.close()


def test_lease_end_after_a_stream_end_deletes_the_records_in_memory_and_on_disk(tmp_path) -> None:
    from kubelet_dra.state import store

    db = store.HealthStore.open(tmp_path)
    cache = healthinfo.HealthCache(sink=db)
    cache.update(DRV, [rep("a", H.UNHEALTHY)], now=T0, endpoint="e")
    assert cache.end_endpoint(DRV, "e", T0 + 1) == []
    db.close()
    # The stream end left the state file alone: a restarted sidecar loads the lease.
    reopened = store.HealthStore.open(tmp_path)
    rows = reopened.load()
    assert [k for k, _ in rows] == [key("a")]
    fresh = healthinfo.HealthCache(sink=reopened)
    fresh.load(rows)
    assert fresh.get(key("a"), T0 + 2).health is H.UNHEALTHY
    assert fresh.expire(T0 + 31) == [key("a")]
    assert list(fresh.records()) == []
    reopened.close()
    again = store.HealthStore.open(tmp_path)
    assert again.load() == []
    again.close()


def test_message_cut_at_a_character_boundary_is_a_deliberate_difference() -> None:
    # Reference section 9.4: the kubelet (up to v1.38.0-beta.0) keeps 1021 bytes
    # even inside a multi-byte character; 600 x "é" (1200 bytes) becomes 510 x
    # "é", half of the 511th, and "...". We drop the half character instead.
    message = "é" * 600
    kubelet = message.encode()[:1021] + b"..."
    assert len(kubelet) == 1024
    with pytest.raises(UnicodeDecodeError):
        kubelet.decode("utf-8")  # the kubelet's cut is not valid UTF-8
    ours = healthinfo.truncate_message(message)
    assert ours == "é" * 510 + "..."
    assert len(ours.encode()) == 1023  # one byte shorter than the kubelet's
    assert kubelet.startswith(ours[:-3].encode())  # same text up to the cut

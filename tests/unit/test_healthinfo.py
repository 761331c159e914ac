"""Health cache semantics: the kubelet's healthinfo_test.go scenarios, and what we do better.

Upstream scenarios (reference section 6.1) are tables below; the kubelet tests
move ``LastUpdated`` back in time, here time moves forward instead (``now``
is an argument).
"""

from __future__ import annotations

import pytest

from kubelet_dra import healthinfo, models

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
    from kubelet_dra import store

    db = store.HealthStore.open(tmp_path)
    cache = healthinfo.HealthCache(sink=db)
    # (1) new Healthy device => changed.
    assert cache.update(DRV, [rep("device1", H.HEALTHY)], now=T0) == [key("device1")]
    assert cache.get(key("device1"), T0).health is H.HEALTHY
    # (2) the same report again => no change.
    assert cache.update(DRV, [rep("device1", H.HEALTHY)], now=T0 + 1) == []
    # (3) Unhealthy => changed.
    assert cache.update(DRV, [rep("device1", H.UNHEALTHY)], now=T0 + 2) == [key("device1")]
    # (4) 60 s later only device2 is reported => device2 new, device1 Unknown.
    changed = cache.update(DRV, [rep("device2", H.HEALTHY)], now=T0 + 62)
    assert set(changed) == {key("device1"), key("device2")}
    assert cache.get(key("device1"), T0 + 62).health is H.UNKNOWN
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
    stored = dict(fresh.records())[key("timeoutDevice")]
    assert stored.health is H.UNKNOWN
    reopened.close()


def test_clear_driver_turns_devices_unknown(cache: healthinfo.HealthCache) -> None:
    cache.update(DRV, [rep("dev", H.HEALTHY)], now=T0)
    assert cache.clear_driver(DRV, T0 + 1) == [key("dev")]
    assert cache.get(key("dev"), T0 + 1).health is H.UNKNOWN


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


# -- beyond the kubelet: per-endpoint ownership --------------------------------


def test_end_of_one_endpoint_keeps_devices_another_endpoint_reports(
    cache: healthinfo.HealthCache,
) -> None:
    cache.update(DRV, [rep("a", H.HEALTHY), rep("b", H.HEALTHY)], now=T0, endpoint="old")
    cache.update(DRV, [rep("a", H.HEALTHY)], now=T0 + 1, endpoint="new")
    assert cache.end_endpoint(DRV, "old", T0 + 2) == [key("b")]
    assert cache.get(key("a"), T0 + 2).health is H.HEALTHY
    assert cache.get(key("b"), T0 + 2).health is H.UNKNOWN


def test_end_endpoint_returns_nothing_when_devices_already_unknown(
    cache: healthinfo.HealthCache,
) -> None:
    cache.update(DRV, [rep("a", H.HEALTHY)], now=T0, endpoint="e")
    assert cache.end_endpoint(DRV, "e", T0 + 1) == [key("a")]
    assert cache.end_endpoint(DRV, "e", T0 + 2) == []


def test_end_endpoint_touches_only_its_driver(cache: healthinfo.HealthCache) -> None:
    cache.update(DRV, [rep("a", H.HEALTHY)], now=T0, endpoint="e")
    cache.update("other", [rep("a", H.HEALTHY)], now=T0, endpoint="e")
    assert cache.end_endpoint(DRV, "e", T0 + 1) == [key("a")]
    assert cache.get(models.DeviceKey("other", "pool", "a"), T0 + 1).health is H.HEALTHY


def test_invalid_default_lease_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        healthinfo.HealthCache(default_lease=0)

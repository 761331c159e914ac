"""The health cache's details that the broader healthinfo tests do not pin down.

Each test states one behaviour of ``kubelet_dra/state/healthinfo.py`` (the port of the
kubelet's ``pkg/kubelet/cm/dra/healthinfo.go``, see its docstring for where it
follows and where it deliberately differs): the message cut, the default lease,
expiry at the deadline, deletion of overdue records, what is handed to the sink.
Written against mutation testing's survivors (docs/testing.md).
"""

from __future__ import annotations

import logging

import pytest

from kubelet_dra import models
from kubelet_dra.state import healthinfo
from tests.unit._cache_sink import Sink

H = models.HealthStatus
T0 = 1_000_000.0
DRV = "drv"


def rep(device: str, health: H = H.HEALTHY, *, timeout: int = 0, message: str = ""):
    return models.DeviceReport("pool", device, health, message, timeout)


def key(device: str, driver: str = DRV) -> models.DeviceKey:
    return models.DeviceKey(driver, "pool", device)


# -- the message cut (the kubelet keeps 1021 bytes and appends "...") ----------------


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("x" * 1024, "x" * 1024),  # at the limit: kept whole
        ("x" * 1025, "x" * 1021 + "..."),
        ("é" * 512, "é" * 512),  # 1024 bytes
        ("x" + "é" * 512, "x" + "é" * 510 + "..."),  # byte 1021 would split an "é"
        ("x" * 1020 + "☃" + "y" * 10, "x" * 1020 + "..."),
    ],
    ids=["1024", "1025", "1024-multibyte", "split-2-byte", "split-3-byte"],
)
def test_truncate_message_cuts_at_1021_bytes_and_drops_a_split_character(
    message: str, expected: str
) -> None:
    cut = healthinfo.truncate_message(message)
    assert cut == expected
    assert len(cut.encode("utf-8")) <= healthinfo.MESSAGE_MAX_BYTES


# -- the default lease ---------------------------------------------------------------


def test_a_default_lease_below_one_second_is_allowed() -> None:
    cache = healthinfo.HealthCache(default_lease=0.5)
    assert cache.lease_for(0) == 0.5
    assert cache.lease_for(-3) == 0.5  # a negative timeout is no timeout
    assert cache.lease_for(1) == 1.0
    assert cache.lease_for(7) == 7.0
    cache.update(DRV, [rep("d")], now=T0)
    assert cache.get(key("d"), T0 + 0.5).health is H.HEALTHY
    assert cache.get(key("d"), T0 + 0.6).health is H.UNKNOWN


@pytest.mark.parametrize("lease", [0, 0.0, -1, -30.0])
def test_a_lease_that_is_not_positive_is_refused(lease: float) -> None:
    with pytest.raises(ValueError) as caught:
        healthinfo.HealthCache(default_lease=lease)
    assert str(caught.value) == "default_lease must be positive"


def test_the_kubelet_default_lease_is_30_seconds() -> None:
    cache = healthinfo.HealthCache()
    assert cache.default_lease == healthinfo.DEFAULT_HEALTH_TIMEOUT == 30.0
    assert cache.lease_for(0) == 30.0


# -- the per-driver cap, cheaply (the cap itself is tested in test_healthinfo.py) ----


def test_refusals_beyond_the_cap_add_up_and_are_logged_once_per_report(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(healthinfo, "MAX_DEVICES_PER_DRIVER", 2)
    cache = healthinfo.HealthCache()
    with caplog.at_level(logging.ERROR, logger="kubelet_dra.state.healthinfo"):
        cache.update(DRV, [rep("a"), rep("b"), rep("c")], now=T0)
        cache.update(DRV, [rep("d"), rep("e"), rep("a", H.UNHEALTHY)], now=T0 + 1)
        cache.update("other", [rep("a"), rep("b")], now=T0 + 1)
    assert cache.refused == {DRV: 3}
    assert len(cache) == 4
    assert cache.get(key("a"), T0 + 1).health is H.UNHEALTHY  # known: still updated
    lines = [r for r in caplog.records if r.name == "kubelet_dra.state.healthinfo"]
    assert [(r.levelno, r.getMessage()) for r in lines] == [
        (
            logging.ERROR,
            f"health report of driver {DRV} names more devices than the 2 kept per driver; "
            f"ignored {n} new devices (known devices are still updated)",
        )
        for n in (1, 2)
    ]


# -- reading -------------------------------------------------------------------------


def test_an_expired_record_reads_unknown_but_keeps_its_lease_times_and_endpoint() -> None:
    cache = healthinfo.HealthCache()
    cache.update(
        DRV, [models.DeviceReport("pool", "d", H.UNHEALTHY, "ecc", 10, 77)], now=T0, endpoint="/e"
    )
    assert cache.get(key("d"), T0 + 10) == models.DeviceHealth(
        H.UNHEALTHY, "ecc", 10.0, T0, 77, "/e"
    )
    assert cache.get(key("d"), T0 + 11) == models.DeviceHealth(H.UNKNOWN, "", 10.0, T0, 77, "/e")
    # records() gives what is stored, without expiry
    assert list(cache.records()) == [
        (key("d"), models.DeviceHealth(H.UNHEALTHY, "ecc", 10.0, T0, 77, "/e"))
    ]
    [(k, _)] = cache.records()
    assert type(k) is models.DeviceKey
    assert cache.get(key("nope"), T0) is models.UNKNOWN_DEVICE


def test_drivers_are_listed_sorted_and_counted() -> None:
    cache = healthinfo.HealthCache()
    cache.update("b", [rep("x"), rep("y")], now=T0)
    cache.update("a", [rep("x")], now=T0)
    assert cache.drivers() == ["a", "b"]
    assert len(cache) == 3
    cache.clear_driver("b")
    assert cache.drivers() == ["a"]
    assert len(cache) == 1


# -- what the sink is given ----------------------------------------------------------


def test_the_sink_gets_each_changed_record_of_a_report_in_one_call() -> None:
    sink = Sink()
    cache = healthinfo.HealthCache(sink=sink)
    cache.update(
        DRV, [rep("a"), rep("b", H.UNHEALTHY, message="m", timeout=5)], now=T0, endpoint="/e"
    )
    assert sink.calls == [
        (
            "stage_many",
            [
                ((DRV, "pool", "a"), models.DeviceHealth(H.HEALTHY, "", 30.0, T0, 0, "/e")),
                ((DRV, "pool", "b"), models.DeviceHealth(H.UNHEALTHY, "m", 5.0, T0, 0, "/e")),
            ],
        )
    ]
    sink.calls.clear()
    cache.update(
        DRV, [rep("a"), rep("b", H.UNHEALTHY, message="m", timeout=5)], now=T0 + 1, endpoint="/e"
    )
    assert sink.calls == []  # plain renewals, far from half their lease


def test_clear_driver_stages_the_deletion_of_every_device_and_announces_the_visible() -> None:
    sink = Sink()
    cache = healthinfo.HealthCache(sink=sink)
    cache.update(DRV, [rep("a"), rep("b", H.UNKNOWN)], now=T0)
    cache.update("other", [rep("a")], now=T0)
    sink.calls.clear()
    assert cache.clear_driver(DRV) == [key("a")]  # "b" read Unknown already
    assert sink.calls == [("stage_delete", [key("a"), key("b")])]
    assert cache.drivers() == ["other"]
    assert cache.clear_driver("nobody") == []
    assert sink.calls == [("stage_delete", [key("a"), key("b")])]  # nothing more to delete


def test_a_lease_running_out_while_the_endpoint_streams_stages_the_unknown_record() -> None:
    sink = Sink()
    cache = healthinfo.HealthCache(sink=sink)
    cache.update(DRV, [rep("a", message="ok", timeout=10)], now=T0, endpoint="/e")
    sink.calls.clear()
    assert cache.expire(T0 + 11) == [key("a")]
    assert sink.calls == [
        ("stage", (key("a"), models.DeviceHealth(H.UNKNOWN, "", 10.0, T0, 0, "/e")))
    ]
    assert list(cache.records()) == [
        (key("a"), models.DeviceHealth(H.UNKNOWN, "", 10.0, T0, 0, "/e"))
    ]


def test_a_lease_running_out_after_the_stream_ended_stages_the_deletion() -> None:
    sink = Sink()
    cache = healthinfo.HealthCache(sink=sink)
    cache.update(DRV, [rep("a", timeout=10), rep("b", timeout=20)], now=T0, endpoint="/e")
    assert cache.end_endpoint(DRV, "/e", T0 + 1) == []
    sink.calls.clear()
    assert cache.expire(T0 + 11) == [key("a")]
    assert sink.calls == [("stage_delete", [key("a")])]
    assert cache.drivers() == [DRV]
    assert cache.expire(T0 + 21) == [key("b")]
    assert cache.drivers() == []  # the driver's last record went: the driver too
    assert len(cache) == 0


# -- defaults and loading ------------------------------------------------------------


def test_a_report_without_an_endpoint_stores_the_empty_endpoint() -> None:
    cache = healthinfo.HealthCache()
    cache.update_entries(DRV, {("pool", "a"): (H.HEALTHY, "", 0, 0)}, now=T0)
    cache.update(DRV, [rep("b")], now=T0)
    assert cache.get(key("a"), T0).endpoint == ""
    assert cache.get(key("b"), T0).endpoint == ""
    # and a stream end of the empty endpoint is that report's stream end
    assert cache.end_endpoint(DRV, "", T0 + 31) == [key("a"), key("b")]
    assert len(cache) == 0


def test_after_a_load_the_next_deadline_is_the_earliest_loaded_lease_end() -> None:
    cache = healthinfo.HealthCache()
    cache.load(
        [
            (key("late"), models.DeviceHealth(H.HEALTHY, "", 30.0, T0)),
            (key("early"), models.DeviceHealth(H.UNHEALTHY, "x", 10.0, T0 + 5)),
        ]
    )
    assert cache.next_deadline() == T0 + 15
    assert cache.expire(T0 + 15) == []  # strictly after the deadline
    # it read Unhealthy: announced as Unknown, and deleted (no stream of its endpoint runs)
    assert cache.expire(T0 + 15.5) == [key("early")]
    assert [k for k, _ in cache.records()] == [key("late")]
    assert cache.next_deadline() == T0 + 30


def test_a_device_reported_unknown_after_its_lease_ran_out_is_renewed_and_persisted() -> None:
    # The Unknown record staged at the deadline counts as persisted at its receive time
    # (T0): the plain renewal 32 s later is past half the lease, so it is persisted.
    sink = Sink()
    cache = healthinfo.HealthCache(sink=sink)
    cache.update(DRV, [rep("a", message="ok")], now=T0, endpoint="/e")
    assert cache.expire(T0 + 31) == [key("a")]
    sink.calls.clear()
    assert cache.update(DRV, [rep("a", H.UNKNOWN)], now=T0 + 32, endpoint="/e") == []
    renewed = models.DeviceHealth(H.UNKNOWN, "", 30.0, T0 + 32, 0, "/e")
    assert sink.calls == [("stage_many", [((DRV, "pool", "a"), renewed)])]
    assert cache.get(key("a"), T0 + 32) == renewed


def test_a_report_at_exactly_the_lease_end_renews_without_a_change() -> None:
    # The kubelet's expiry is strictly after the timeout (now - LastUpdated > timeout):
    # at exactly 30 s the record is still valid, so the same report changes nothing.
    cache = healthinfo.HealthCache()
    cache.update(DRV, [rep("a", message="ok")], now=T0)
    assert cache.update(DRV, [rep("a", message="ok")], now=T0 + 30) == []
    assert cache.get(key("a"), T0 + 60).health is H.HEALTHY  # renewed at T0 + 30


def test_a_device_revived_after_it_was_expired_is_announced() -> None:
    cache = healthinfo.HealthCache()
    cache.update(DRV, [rep("a", message="ok")], now=T0)
    assert cache.expire(T0 + 31) == [key("a")]
    assert cache.update(DRV, [rep("a", message="ok")], now=T0 + 32) == [key("a")]
    assert cache.update(DRV, [rep("a", message="ok")], now=T0 + 33) == []
    # Healthy without a message is a change from Unknown too
    assert cache.update(DRV, [rep("b")], now=T0 + 33) == [key("b")]
    assert cache.expire(T0 + 64) == [key("a"), key("b")]
    assert cache.update(DRV, [rep("b")], now=T0 + 65) == [key("b")]

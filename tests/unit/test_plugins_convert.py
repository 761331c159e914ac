"""Report conversion (the kubelet's buildDeviceHealth) and the reconnect backoff."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import pytest

from kubelet_dra import models
from kubelet_dra._proto.dra_health.v1 import api_pb2 as v1
from kubelet_dra._proto.dra_health.v1alpha1 import api_pb2 as v1alpha1
from kubelet_dra.plugin import streams

H = models.HealthStatus


def dh(pb: ModuleType, pool: str = "p", device: str = "d", health: int = 1, **kw: Any) -> Any:
    return pb.DeviceHealth(
        device=pb.DeviceIdentifier(pool_name=pool, device_name=device), health=health, **kw
    )


@pytest.mark.parametrize("pb", [v1, v1alpha1], ids=["v1", "v1alpha1"])
@pytest.mark.parametrize(
    ("health", "expected"),
    [(0, H.UNKNOWN), (1, H.HEALTHY), (2, H.UNHEALTHY), (99, H.UNKNOWN)],
    ids=["unknown", "healthy", "unhealthy", "enum-99"],
)
def test_both_versions_convert_to_the_same_values(pb: ModuleType, health: int, expected: H) -> None:
    device = dh(
        pb, health=health, last_updated_time=123, health_check_timeout_seconds=12, message="m"
    )
    converted = streams.convert([device], max_devices=10)
    assert converted.reports == [
        models.DeviceReport("p", "d", expected, "m", timeout_seconds=12, driver_time=123)
    ]
    assert converted.problems.get("unknown_health", 0) == (1 if health == 99 else 0)


def test_duplicates_take_the_last_and_are_counted() -> None:
    converted = streams.convert(
        [dh(v1, device="a", health=1), dh(v1, device="b"), dh(v1, device="a", health=2)],
        max_devices=10,
    )
    assert [(r.device, r.health) for r in converted.reports] == [
        ("b", H.HEALTHY),
        ("a", H.UNHEALTHY),
    ]
    assert converted.problems == {"duplicate": 1}


@pytest.mark.parametrize(
    ("device", "reason"),
    [
        (dh(v1, pool=""), "empty_name"),
        (dh(v1, device=""), "empty_name"),
        (dh(v1, device="x" * 1025), "name_too_long"),
    ],
    ids=["empty-pool", "empty-device", "name-too-long"],
)
def test_bad_names_are_refused(device: Any, reason: str) -> None:
    converted = streams.convert([device, dh(v1, device="ok")], max_devices=10)
    assert [r.device for r in converted.reports] == ["ok"]
    assert converted.problems == {reason: 1}


def test_long_message_is_truncated_and_negative_timeout_kept_for_the_default() -> None:
    converted = streams.convert(
        [dh(v1, message="é" * 1000, health_check_timeout_seconds=-1)], max_devices=10
    )
    (report,) = converted.reports
    assert len(report.message.encode()) <= 1024 and report.message.endswith("...")
    assert report.timeout_seconds == -1  # the cache reads <= 0 as its default lease
    assert converted.problems == {"message_truncated": 1, "negative_timeout": 1}


def test_too_many_devices_refuses_the_whole_report() -> None:
    converted = streams.convert([dh(v1, device=str(i)) for i in range(11)], max_devices=10)
    assert (converted.reports, converted.refused) == ([], "too_many_devices")


def test_backoff_doubles_to_the_cap_with_bounded_jitter() -> None:
    backoff = streams.Backoff(initial=1.0, cap=30.0, rng=random.Random(7))
    delays = [backoff.next() for _ in range(8)]
    for delay, base in zip(delays, [1, 2, 4, 8, 16, 30, 30, 30], strict=True):
        assert base * 0.8 <= delay <= min(base * 1.2, 30.0)
    backoff.reset()
    assert backoff.next() <= 1.2

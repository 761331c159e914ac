"""Bad health reports at the wire: whatever a driver sends, nothing crashes, the store validates.

Reports are built as v1 and v1alpha1 protobuf responses, serialized and parsed
back (what the stream receives), converted by ``streams.convert``, applied to
a ``HealthCache`` whose sink is a real ``HealthStore``, flushed and read back.
Property-based (hypothesis) over names with ``/``, unicode, empty strings and
10 kB names, enum numbers outside the enum, negative and huge timeouts and
messages of every length around the 1024-byte limit; plus fixed cases for the
byte at which a multi-byte character is cut.
"""

from __future__ import annotations

import pathlib
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubelet_dra import models
from kubelet_dra._proto.dra_health.v1 import api_pb2 as v1
from kubelet_dra._proto.dra_health.v1alpha1 import api_pb2 as v1alpha1
from kubelet_dra.plugin import streams
from kubelet_dra.state import healthinfo, store

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
names = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", "/", "a/b", "../x", "\x00", "☃", "gpu-0", " ", "\u202e"]),
    st.sampled_from(["x" * 10_000, "é/" * 5_000, "x" * 1024, "é" * 512 + "x"]),
)
MULTI = ["a", "é", "✗", "😀"]
messages = st.one_of(
    st.text(max_size=40),
    st.builds(
        lambda char, count, pad: "a" * pad + char * count,
        st.sampled_from(MULTI),
        st.integers(250, 1100),
        st.integers(0, 3),
    ),
)
devices = st.fixed_dictionaries(
    {
        "pool": names,
        "device": names,
        "health": st.integers(min_value=-(2**31), max_value=2**31 - 1),
        "timeout": INT64,
        "time": INT64,
        "message": messages,
    }
)


def _response(pb: ModuleType, entries: list[dict[str, Any]]) -> Any:
    message = pb.NodeWatchResourcesResponse(
        devices=[
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=e["pool"], device_name=e["device"]),
                health=e["health"],
                last_updated_time=e["time"],
                health_check_timeout_seconds=e["timeout"],
                message=e["message"],
            )
            for e in entries
        ]
    )
    wire = message.SerializeToString()
    return pb.NodeWatchResourcesResponse.FromString(wire)


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    # Module scope: hypothesis runs every example in one call of the test function.
    return tmp_path_factory.mktemp("kdbad") / "state"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([v1, v1alpha1]), st.lists(st.lists(devices, max_size=6), max_size=4))
def test_any_report_converts_applies_and_persists_valid_state(
    state_dir: pathlib.Path, pb: ModuleType, reports: list[list[dict[str, object]]]
) -> None:
    db = store.HealthStore.open(state_dir)
    try:
        cache = healthinfo.HealthCache(sink=db)
        now = 1_000_000.0
        for entries in reports:
            converted = streams.convert(_response(pb, entries).devices, max_devices=5)
            assert (converted.refused is not None) == (len(entries) > 5)
            for report in converted.reports:
                _check_report(report)
            now += 1
            cache.update("drv", converted.reports, now=now, endpoint="/e.sock")
            cache.expire(now + 31)
        db.flush()
        stored = dict(db.load())
        assert db.skipped_rows == 0
        live = dict(cache.records())
        assert stored.keys() == live.keys()
        for key, record in live.items():
            # Renewals are persisted at half lease (healthinfo.PERSIST_FRACTION):
            # the stored copy may be older, never by half its lease or more.
            kept = stored[key]
            assert (kept.health, kept.message, kept.lease, kept.endpoint) == (
                record.health, record.message, record.lease, record.endpoint,
            )  # fmt: skip
            assert record.last_report - kept.last_report < record.lease / 2
    finally:
        db.close()
        for path in state_dir.iterdir():
            path.unlink()


def _check_report(report: models.DeviceReport) -> None:
    assert report.pool and report.device
    assert len(report.pool.encode()) <= streams.MAX_NAME_BYTES
    assert len(report.device.encode()) <= streams.MAX_NAME_BYTES
    assert isinstance(report.health, models.HealthStatus)
    raw = report.message.encode("utf-8")  # valid UTF-8 or this raises
    assert len(raw) <= healthinfo.MESSAGE_MAX_BYTES


@pytest.mark.parametrize("char", MULTI, ids=["1-byte", "2-byte", "3-byte", "4-byte"])
@pytest.mark.parametrize("total", range(1016, 1034))
def test_message_cut_inside_a_multibyte_character_stays_valid(char: str, total: int) -> None:
    width = len(char.encode())
    pad = total % width
    message = "a" * pad + char * ((total - pad) // width)
    assert len(message.encode()) == total
    [entry] = streams.convert(
        _response(v1, [_entry(message=message)]).devices,
        max_devices=10,
    ).reports
    out = entry.message.encode("utf-8")
    assert len(out) <= healthinfo.MESSAGE_MAX_BYTES
    if total <= healthinfo.MESSAGE_MAX_BYTES:
        assert entry.message == message
    else:
        assert entry.message.endswith("...") and message.startswith(entry.message[:-3])
        assert len(out) > healthinfo.MESSAGE_MAX_BYTES - 3 - width


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("health", 3, "unknown_health"),
        ("health", -1, "unknown_health"),
        ("health", 2**31 - 1, "unknown_health"),
        ("timeout", -1, "negative_timeout"),
        ("timeout", -(2**63), "negative_timeout"),
        ("pool", "", "empty_name"),
        ("device", "x" * 1025, "name_too_long"),
        ("device", "é" * 513, "name_too_long"),
    ],
)
def test_each_bad_field_is_counted_with_its_reason(field: str, value: object, problem: str) -> None:
    converted = streams.convert(
        _response(v1, [_entry(**{field: value})]).devices,
        max_devices=10,
    )
    assert converted.problems[problem] == 1


def test_huge_timeout_is_a_valid_lease_and_round_trips(tmp_path: pathlib.Path) -> None:
    [report] = streams.convert(
        _response(v1, [_entry(timeout=2**63 - 1)]).devices,
        max_devices=10,
    ).reports
    db = store.HealthStore.open(tmp_path)
    cache = healthinfo.HealthCache(sink=db)
    cache.update("drv", [report], now=1_000_000.0)
    db.close()
    again = store.HealthStore.open(tmp_path)
    [(_, record)] = again.load()
    again.close()
    assert record.lease == float(2**63 - 1) and record.health is models.HealthStatus.HEALTHY


def _entry(**fields: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "pool": "pool",
        "device": "gpu-0",
        "health": 1,
        "timeout": 0,
        "time": 1,
        "message": "",
    }
    entry.update(fields)
    return entry

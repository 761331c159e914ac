"""Fuzz target: a driver's health report, from wire bytes to the health cache and the state file.

Mirrors ``buildDeviceHealth`` (``pkg/kubelet/cm/dra/manager.go``) and
``updateHealthInfo`` (``pkg/kubelet/cm/dra/healthinfo.go``) as
``kubelet_dra.plugin.streams.convert`` and ``kubelet_dra.state.healthinfo.HealthCache``
implement them. Properties:

- the same bytes read as a v1 and a v1alpha1 ``NodeWatchResourcesResponse``
  convert to the same entries (the two versions share their wire format);
- a report over the device limit is refused whole and counted; otherwise
  every entry has non-empty names within ``MAX_NAME_BYTES`` and a message
  within ``MESSAGE_MAX_BYTES``, and every refused or altered device is
  counted in ``problems``;
- the cache holds exactly the reported devices, each as reported; the same
  report half a second later changes nothing a reader sees;
- each record the cache hands the state file encodes (``store._value_text``)
  to JSON that is ``json.dumps`` of the record, and reads back
  (``StoredDevice``) to the same record: the state-file round trip.

Input: the first byte sets the device limit (1 to 64), the rest is the message.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

from tests.fuzz import _harness

with _harness.instrumented(__name__ == "__main__"):
    from google.protobuf import message

    from kubelet_dra import models
    from kubelet_dra._proto.dra_health.v1 import api_pb2 as v1_pb2
    from kubelet_dra._proto.dra_health.v1alpha1 import api_pb2 as v1alpha1_pb2
    from kubelet_dra.plugin import streams
    from kubelet_dra.state import healthinfo, store

DRIVER = "gpu.example.com"
NOW = 1_000_000.0


class _Sink:
    def __init__(self) -> None:
        self.staged: list[tuple[healthinfo.StagedKey, models.DeviceHealth]] = []

    def stage(self, key: models.DeviceKey, record: models.DeviceHealth) -> None:
        self.staged.append((tuple(key), record))  # type: ignore[arg-type]

    def stage_many(
        self, records: Iterable[tuple[healthinfo.StagedKey, models.DeviceHealth]]
    ) -> None:
        self.staged.extend(records)

    def stage_delete(self, keys: object) -> None:
        raise AssertionError("a first report deletes nothing")


def _converted(data: bytes, limit: int) -> streams.Converted | None:
    try:
        v1 = v1_pb2.NodeWatchResourcesResponse.FromString(data)
    except message.DecodeError:
        return None
    alpha = v1alpha1_pb2.NodeWatchResourcesResponse.FromString(data)
    converted = streams.convert(v1.devices, max_devices=limit)
    other = streams.convert(alpha.devices, max_devices=limit)
    assert (converted.entries, converted.problems, converted.refused) == (
        other.entries,
        other.problems,
        other.refused,
    )
    if converted.refused:
        assert len(v1.devices) > limit and not converted.entries
        assert converted.problems["too_many_devices"] == 1
        return None
    dropped = len(v1.devices) - len(converted.entries)
    assert dropped == sum(
        converted.problems[p] for p in ("empty_name", "name_too_long", "duplicate")
    ), (dropped, converted.problems)
    for (pool, device), (health, text, _timeout, _driver_time) in converted.entries.items():
        assert pool and device
        assert len(pool.encode()) <= streams.MAX_NAME_BYTES >= len(device.encode())
        assert len(text.encode()) <= healthinfo.MESSAGE_MAX_BYTES
        assert isinstance(health, models.HealthStatus)
    return converted


def _round_trip(key: healthinfo.StagedKey, record: models.DeviceHealth) -> None:
    key_text, value_text = store._value_text(key, record)
    assert json.loads(key_text) == list(key)
    assert json.loads(value_text) == store._value(key, record), value_text
    loaded = store.StoredDevice.model_validate_json(value_text).to_record()
    assert loaded == (models.DeviceKey(*key), record), (loaded, record)


def test_one(data: bytes) -> None:
    if not data:
        return
    converted = _converted(data[1:], 1 + data[0] % 64)
    if converted is None:
        return
    sink = _Sink()
    cache = healthinfo.HealthCache(default_lease=30.0, sink=sink)
    changed = cache.update_entries(DRIVER, converted.entries, now=NOW)
    assert len(changed) == len(converted.entries) == len(cache)
    for (pool, device), (health, text, timeout, driver_time) in converted.entries.items():
        record = cache.get(models.DeviceKey(DRIVER, pool, device), NOW)
        assert (record.health, record.message, record.driver_time) == (health, text, driver_time)
        assert record.lease == (float(timeout) if timeout > 0 else 30.0) and math.isfinite(
            record.lease
        )
    assert len(sink.staged) == len(converted.entries)
    for key, record in sink.staged:
        _round_trip(key, record)
    again = cache.update_entries(DRIVER, converted.entries, now=NOW + 0.5)
    assert again == [], again


if __name__ == "__main__":
    _harness.main(test_one, __file__)

"""Fuzz target: the readers of the kubelet's two checkpoint files.

- ``dra_manager_state`` (``kubelet_dra.state.kubeletcheckpoint.parse``, mirroring
  ``pkg/kubelet/cm/dra/state/checkpoint.go``): a refused file raises
  ``CheckpointError`` with one of ``REASONS`` and nothing else; a file read
  is written again as the kubelet writes it (Go's JSON, crc32 of Data) and
  reads back to the same claims; the same file with another checksum is
  refused with reason ``checksum``.
- ``dra_health_state`` (``kubelet_dra.commands.cache.read_kubelet_state``,
  the kubelet's ``pkg/kubelet/cm/dra/healthinfo.go`` file): a refused file
  raises ``StoreError`` and nothing else; every row read is a device record
  a cache could hold (a known health, a positive finite lease, a finite time).

The first byte picks the reader; the rest is the file.
"""

from __future__ import annotations

import atexit
import json
import math
import pathlib
import shutil
import tempfile
import zlib
from typing import Any

from tests.fuzz import _harness

with _harness.instrumented(__name__ == "__main__"):
    from kubelet_dra import errors, models
    from kubelet_dra.commands import cache
    from kubelet_dra.state import kubeletcheckpoint

_TMP = pathlib.Path(tempfile.mkdtemp(prefix="fuzz-checkpoints-"))
atexit.register(shutil.rmtree, _TMP, True)
_HEALTH_FILE = _TMP / "dra_health_state"


def _go_json(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, escaped)
    return text


def _claim_state(claim: kubeletcheckpoint.PreparedClaim) -> dict[str, Any]:
    drivers: dict[str, Any] = {}
    for device in claim.devices:
        drivers.setdefault(device.driver, {"Devices": []})["Devices"].append(
            {
                "PoolName": device.pool,
                "DeviceName": device.device,
                "ShareID": device.share_id,
                "RequestNames": list(device.request_names),
                "CDIDeviceIDs": list(device.cdi_ids),
            }
        )
    return {
        "ClaimUID": claim.uid,
        "ClaimName": claim.name,
        "Namespace": claim.namespace,
        "PodUIDs": {uid: {} for uid in sorted(claim.pod_uids)},
        "DriverState": drivers,
    }


def _write(found: tuple[kubeletcheckpoint.PreparedClaim, ...], checksum_delta: int = 0) -> bytes:
    data = _go_json(
        {
            "kind": kubeletcheckpoint.KIND,
            "apiVersion": kubeletcheckpoint.API_VERSION,
            "ClaimInfoStateList": [_claim_state(c) for c in found],
        }
    )
    checksum = (zlib.crc32(data.encode("utf-8", "surrogatepass")) + checksum_delta) % 2**32
    return _go_json({"Data": data, "Checksum": checksum}).encode("utf-8", "surrogatepass")


def _manager_state(blob: bytes) -> None:
    try:
        found = kubeletcheckpoint.parse(blob)
    except errors.CheckpointError as exc:
        assert exc.reason in kubeletcheckpoint.REASONS, exc.reason
        return
    again = kubeletcheckpoint.parse(_write(found))
    assert again == found, (again, found)
    try:
        kubeletcheckpoint.parse(_write(found, checksum_delta=1))
    except errors.CheckpointError as exc:
        assert exc.reason == kubeletcheckpoint.REASON_CHECKSUM, exc.reason
    else:
        raise AssertionError("a wrong checksum was accepted")


def _health_state(blob: bytes) -> None:
    _HEALTH_FILE.write_bytes(blob)
    try:
        rows = cache.read_kubelet_state(_HEALTH_FILE, default_lease=30.0)
    except errors.StoreError:
        return
    for key, record in rows:
        assert all(isinstance(part, str) for part in key), key
        assert isinstance(record.health, models.HealthStatus), record
        assert math.isfinite(record.lease) and record.lease > 0, record
        assert math.isfinite(record.last_report), record
        assert isinstance(record.message, str), record


def test_one(data: bytes) -> None:
    if not data:
        return
    if data[0] % 2 == 0:
        _manager_state(data[1:])
    else:
        _health_state(data[1:])


if __name__ == "__main__":
    _harness.main(test_one, __file__)

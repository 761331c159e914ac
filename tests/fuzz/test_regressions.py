"""Regression tests for what fuzzing found (``tests/fuzz``, ``docs/reliability.md``).

Each test names the target that found the input, and checks the fixed
behaviour through the public entry point, with real files (SQLite, JSON).
"""

from __future__ import annotations

import json
import pathlib
import sqlite3
import threading

import pytest

from kubelet_dra import errors, models
from kubelet_dra.commands import cache
from kubelet_dra.state import store

RECORD = {
    "v": 1,
    "driver": "gpu.example.com",
    "pool": "pool-a",
    "device": "gpu-0",
    "health": "Healthy",
    "message": "",
    "lease": 30.0,
    "last_report": 1.5,
}


KEY = models.DeviceKey("gpu.example.com", "pool-a", "gpu-0")
DEVICE = models.DeviceHealth(models.HealthStatus.UNHEALTHY, "XID 79", 30.0, 1000.0, 7, "/e.sock")


def _write_rows(path: pathlib.Path, values: list[object]) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.executemany(
            'INSERT INTO "devices" (key, value) VALUES (?, ?)',
            [(json.dumps(["d", "p", str(i)]), v) for i, v in enumerate(values)],
        )
        conn.commit()
    finally:
        conn.close()


Records = list[tuple[models.DeviceKey, models.DeviceHealth]]


def _load_within(health: store.HealthStore, seconds: float) -> Records:
    out: list[Records] = []
    thread = threading.Thread(target=lambda: out.append(health.load()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "load() hangs"
    assert out, "load() raised"
    return out[0]


def test_a_value_that_is_not_utf8_is_skipped_not_a_hang(tmp_path: pathlib.Path) -> None:
    # fuzz_store: a BLOB value with invalid UTF-8 killed sqlitedict's worker
    # thread while it fetched the chunk, and load() waited for it forever.
    health = store.HealthStore.open(tmp_path)
    try:
        good = json.dumps(RECORD)
        bad = json.dumps({**RECORD, "device": "gpu-1", "message": "x"}).encode()
        bad = bad.replace(b'"x"', b'"\xc6\xc6"')
        _write_rows(health.path, [good, bad, json.dumps({**RECORD, "device": "gpu-2"})])
        loaded = _load_within(health, 10)
        assert [key.device for key, _ in loaded] == ["gpu-0", "gpu-2"]
        assert health.skipped_rows == 1
    finally:
        health.close()


def test_rows_that_only_read_as_records_when_joined_are_skipped(tmp_path: pathlib.Path) -> None:
    # The chunked load joins values with "," inside "[...]": two values that
    # are not JSON alone can join into two valid records. Read alone, as the
    # row-by-row path reads them, both are refused; so must the fast path.
    health = store.HealthStore.open(tmp_path)
    try:
        first = json.dumps(RECORD) + ', {"v": 1'
        second = ", ".join(f'"{k}": {json.dumps(v)}' for k, v in RECORD.items() if k != "v") + "}"
        second = second.replace('"gpu-0"', '"gpu-1"')
        _write_rows(health.path, [first, second])
        assert _load_within(health, 10) == []
        assert health.skipped_rows == 2
    finally:
        health.close()


def test_a_good_file_still_loads_fast(tmp_path: pathlib.Path) -> None:
    health = store.HealthStore.open(tmp_path)
    key = models.DeviceKey("gpu.example.com", "pool-a", "gpu-0")
    record = models.DeviceHealth(models.HealthStatus.UNHEALTHY, "XID", 30.0, 1.5, 3, "/e.sock")
    health.stage(key, record)
    health.flush()
    health.close()
    again = store.HealthStore.open(tmp_path)
    try:
        assert again.load() == [(key, record)]
        assert again.skipped_rows == 0
    finally:
        again.close()


@pytest.mark.parametrize(
    "timeout",
    ['"600"', '"x"', "[1]", "1e400", "1.5", "true", "9" * 320, str(2**63)],
)
def test_a_kubelet_health_state_with_a_bad_timeout_is_refused_clearly(
    tmp_path: pathlib.Path, timeout: str
) -> None:
    # fuzz_checkpoints: HealthCheckTimeout went through int() unchecked, so a
    # string, a list or a huge number escaped as ValueError, TypeError or
    # OverflowError instead of the command's StoreError. Go's decoder refuses
    # the whole file for a timeout that is not an int64 (time.Duration).
    path = tmp_path / "dra_health_state"
    path.write_text(f'{{"d": {{"Devices": {{"p/d": {{"HealthCheckTimeout": {timeout}}}}}}}}}')
    with pytest.raises(errors.StoreError, match="HealthCheckTimeout"):
        cache.read_kubelet_state(path, default_lease=30.0)


def test_a_kubelet_health_state_timeout_in_range_is_read(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "dra_health_state"
    path.write_text(f'{{"d": {{"Devices": {{"p/d": {{"HealthCheckTimeout": {2**63 - 1}}}}}}}}}')
    [(_, record)] = cache.read_kubelet_state(path, default_lease=30.0)
    assert record.lease == (2**63 - 1) / 1e9


@pytest.mark.parametrize("op", ["move", "remove"])
def test_a_json_patch_that_removes_the_root_is_a_422(op: str) -> None:
    # fuzz_patch: {"op": "move", "from": ""} (and "remove" of "") took the
    # last token of an empty pointer: IndexError, a 500 from the fake API
    # server. evanphx/json-patch finds no parent for the root: 422.
    from kubelet_dra.testing.fakeapi import _patch as patching

    operation = {"op": op, "from": "", "path": "/a"} if op == "move" else {"op": op, "path": ""}
    with pytest.raises(patching.PatchError) as refused:
        patching.json_patch({"a": 1}, [operation])
    assert refused.value.code == 422


def test_a_strategic_merge_of_a_primitive_list_shares_nothing_with_its_inputs() -> None:
    # fuzz_patch: metadata.finalizers (patchStrategy=merge) was merged as
    # list(original) + the patch's new items, so the stored object kept the
    # patch's and the old object's items themselves: a later change of one
    # changed the other.
    from kubelet_dra.testing.fakeapi import _patch as patching

    old = {"metadata": {"finalizers": [{"a": 1}]}}
    patch = {"metadata": {"finalizers": [{"b": 2}]}}
    merged = patching.strategic_merge_patch(old, patch)
    assert merged == {"metadata": {"finalizers": [{"a": 1}, {"b": 2}]}}
    merged["metadata"]["finalizers"][0]["a"] = 9
    merged["metadata"]["finalizers"][1]["b"] = 9
    assert old == {"metadata": {"finalizers": [{"a": 1}]}}
    assert patch == {"metadata": {"finalizers": [{"b": 2}]}}


@pytest.mark.parametrize(
    "devices",
    [
        'CREATE TABLE "devices" (key TEXT PRIMARY KEY, vilue BLOB)',  # the fuzzed file
        'CREATE TABLE "devices" (key TEXT PRIMARY KEY)',
        'CREATE VIEW "devices" AS SELECT 1 AS key',
    ],
    ids=["renamed-column", "missing-column", "a-view"],
)
def test_a_devices_table_of_another_shape_is_moved_aside_not_a_crash(
    tmp_path: pathlib.Path, devices: str
) -> None:
    # fuzz_store: a file whose "devices" table had a column renamed passed the
    # integrity check, and load() raised "no such column: value" out of the
    # store, so the sidecar would have crash-looped on it.
    conn = sqlite3.connect(tmp_path / store.FILE_NAME)
    conn.execute(devices)
    conn.commit()
    conn.close()
    health = store.HealthStore.open(tmp_path)
    try:
        assert health.moved_aside is not None
        assert health.load() == []
        health.stage(KEY, DEVICE)
        assert health.flush() == 1, health.last_error
    finally:
        health.close()
    again = store.HealthStore.open(tmp_path)
    try:
        assert again.moved_aside is None
        assert again.load() == [(KEY, DEVICE)]
    finally:
        again.close()

"""The persistent health cache: restart semantics, bad files, failing disks."""

from __future__ import annotations

import json
import os
import pathlib
import sqlite3
import stat

import pytest

from kubelet_dra import errors, models
from kubelet_dra.state import healthinfo, store

H = models.HealthStatus
T0 = 1_000_000.0


def fill(db: store.HealthStore, count: int, *, now: float = T0, timeout: int = 0) -> None:
    cache = healthinfo.HealthCache(sink=db)
    reports = [
        models.DeviceReport("pool", f"dev{i}", H.HEALTHY, "ok", timeout) for i in range(count)
    ]
    cache.update("drv", reports, now=now, endpoint="/run/drv.sock")
    db.flush()


def reopen(state_dir: pathlib.Path) -> tuple[store.HealthStore, healthinfo.HealthCache]:
    db = store.HealthStore.open(state_dir)
    cache = healthinfo.HealthCache(sink=db)
    cache.load(db.load())
    return db, cache


def test_round_trip_keeps_every_field(tmp_path: pathlib.Path) -> None:
    db = store.HealthStore.open(tmp_path)
    cache = healthinfo.HealthCache(sink=db)
    odd = models.DeviceReport("pöol/1", "dev\x00 ☃", H.UNHEALTHY, "ECC ✗", 12, 123)
    cache.update("gpu.example.com", [odd], now=T0, endpoint="/plugins/gpu/dra.sock")
    db.close()
    db2, _ = reopen(tmp_path)
    [(key, record)] = db2.load()
    assert key == models.DeviceKey("gpu.example.com", "pöol/1", "dev\x00 ☃")
    assert record == models.DeviceHealth(
        H.UNHEALTHY, "ECC ✗", 12.0, T0, 123, "/plugins/gpu/dra.sock"
    )
    db2.close()


def test_restart_keeps_unexpired_lease_and_expires_the_rest(tmp_path: pathlib.Path) -> None:
    db = store.HealthStore.open(tmp_path)
    cache = healthinfo.HealthCache(sink=db)
    cache.update("drv", [models.DeviceReport("p", "short", H.HEALTHY, "", 500)], now=T0)
    cache.update("drv", [models.DeviceReport("p", "long", H.HEALTHY, "", 600)], now=T0)
    # A renewal (no visible change) is persisted once the stored copy has half
    # its lease left (healthinfo.PERSIST_FRACTION): not at T0+100, at T0+300.
    cache.update("drv", [models.DeviceReport("p", "long", H.HEALTHY, "", 600)], now=T0 + 100)
    cache.update("drv", [models.DeviceReport("p", "long", H.HEALTHY, "", 600)], now=T0 + 300)
    db.close()
    db2, cache2 = reopen(tmp_path)
    stored = {key.device: record.last_report for key, record in cache2.records()}
    assert stored == {"short": T0, "long": T0 + 300}
    now = T0 + 650  # the process was down for a while
    assert cache2.get(models.DeviceKey("drv", "p", "long"), now).health is H.HEALTHY
    assert cache2.get(models.DeviceKey("drv", "p", "short"), now).health is H.UNKNOWN
    assert cache2.expire(now) == [models.DeviceKey("drv", "p", "short")]
    db2.close()


def test_flush_batches_many_reports_into_one_commit(tmp_path: pathlib.Path) -> None:
    db = store.HealthStore.open(tmp_path)
    cache = healthinfo.HealthCache(sink=db)
    for step in range(50):
        cache.update("drv", [models.DeviceReport("p", "d", H.HEALTHY, str(step))], now=T0 + step)
    assert db.pending == 1  # the latest record per device wins
    assert db.flush() == 1
    assert db.commits == 1
    assert db.flush() == 0
    db.close()
    db2, cache2 = reopen(tmp_path)
    assert cache2.get(models.DeviceKey("drv", "p", "d"), T0 + 49).message == "49"
    db2.close()


def test_sqlite_runs_wal_with_synchronous_full(tmp_path: pathlib.Path) -> None:
    # FULL: a returned commit survives a power loss (tests/powerloss measures it).
    db = store.HealthStore.open(tmp_path)
    assert db.connection is not None
    assert db.connection.query("PRAGMA journal_mode") == ("wal",)
    assert db.connection.query("PRAGMA synchronous") == (2,)  # FULL
    db.close()


def test_state_files_are_private(tmp_path: pathlib.Path) -> None:
    state = tmp_path / "state"
    db = store.HealthStore.open(state)
    fill(db, 3)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for path in state.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path.name
    db.close()


# -- corrupt and foreign files -------------------------------------------------


def valid_file(tmp_path: pathlib.Path) -> bytes:
    src = tmp_path / "src"
    db = store.HealthStore.open(src)
    fill(db, 20)
    db.close()
    return (src / store.FILE_NAME).read_bytes()


def assert_starts_empty_and_moved_aside(state: pathlib.Path) -> None:
    db = store.HealthStore.open(state)
    assert db.moved_aside is not None
    assert db.moved_aside.exists()
    assert db.load() == []
    fill(db, 2)  # and it is writable again
    db.close()
    db2 = store.HealthStore.open(state)
    assert db2.moved_aside is None
    assert len(db2.load()) == 2
    db2.close()


@pytest.mark.parametrize(
    "content",
    [b"garbage" * 100, os.urandom(4096), b"SQLite format 3\x00" + b"\xff" * 4000],
    ids=["text", "random", "bad-header"],
)
def test_garbage_file_is_moved_aside(tmp_path: pathlib.Path, content: bytes) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / store.FILE_NAME).write_bytes(content)
    assert_starts_empty_and_moved_aside(state)


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5, 0.75, 0.9])
def test_truncated_file_opens(tmp_path: pathlib.Path, fraction: float) -> None:
    data = valid_file(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    (state / store.FILE_NAME).write_bytes(data[: int(len(data) * fraction)])
    original = store.HealthStore.open(tmp_path / "src")
    written = set(original.load())
    original.close()
    assert len(written) == 20
    db = store.HealthStore.open(state)  # never raises: either readable or moved aside
    records = db.load()
    aside = sorted(state.glob(f"{store.FILE_NAME}.corrupt-*"))
    if db.moved_aside is not None:
        assert aside == [db.moved_aside] and records == []
    else:
        # Nothing moved aside unsaid, and what a cut file still gives is a
        # subset of what was written, each record intact.
        assert aside == []
        assert set(records) <= written, set(records) - written
        assert len(set(records)) == len(records)
    fill(db, 1)
    db.close()


@pytest.mark.parametrize("version", [0, 2, "1", 99], ids=["old", "future", "string", "far-future"])
def test_unknown_schema_version_is_moved_aside(tmp_path: pathlib.Path, version: object) -> None:
    state = tmp_path / "state"
    db = store.HealthStore.open(state)
    fill(db, 3)
    db.close()
    conn = sqlite3.connect(state / store.FILE_NAME)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (json.dumps(version),))
    conn.commit()
    conn.close()
    assert_starts_empty_and_moved_aside(state)


def test_bad_rows_are_skipped_and_counted(tmp_path: pathlib.Path) -> None:
    state = tmp_path / "state"
    db = store.HealthStore.open(state)
    fill(db, 5)
    db.close()
    conn = sqlite3.connect(state / store.FILE_NAME)
    conn.execute("INSERT INTO devices (key, value) VALUES ('x', 'not json')")
    conn.execute("""INSERT INTO devices (key, value) VALUES ('y', '{"v": 1, "health": "Bad"}')""")
    conn.commit()
    conn.close()
    db2 = store.HealthStore.open(state)
    assert len(db2.load()) == 5
    assert db2.skipped_rows == 2
    db2.close()


# -- failing disks -----------------------------------------------------------------


def test_failed_flush_keeps_records_and_recovers(tmp_path: pathlib.Path) -> None:
    db = store.HealthStore.open(tmp_path)
    cache = healthinfo.HealthCache(sink=db)
    cache.update("drv", [models.DeviceReport("p", "d", H.UNHEALTHY, "x")], now=T0)
    assert db.connection is not None
    db.connection.execute("PRAGMA query_only=ON")  # every write now fails, like a read-only disk
    with pytest.raises(errors.StoreError, match="cannot write"):
        db.flush()
    assert db.degraded and db.pending == 1
    cache.update("drv", [models.DeviceReport("p", "e", H.HEALTHY)], now=T0 + 1)
    assert db.pending == 2
    db.connection.execute("PRAGMA query_only=OFF")
    assert db.flush() == 2
    assert not db.degraded
    db.close()
    db2, cache2 = reopen(tmp_path)
    assert cache2.get(models.DeviceKey("drv", "p", "d"), T0 + 2).health is H.UNHEALTHY
    db2.close()


def test_rows_round_trip_exactly_and_a_rewrite_replaces_the_row(tmp_path: pathlib.Path) -> None:
    db = store.HealthStore.open(tmp_path)
    cache = healthinfo.HealthCache(sink=db)
    odd = models.DeviceReport("pöol", 'dev\x00 ☃ "q"', H.UNHEALTHY, "ECC\n✗", 12, 2**62)
    cache.update("drv", [odd], now=T0 + 0.123456789, endpoint="/e")
    db.flush()
    cache.update("drv", [odd._replace(message="again")], now=T0 + 1, endpoint="/e")
    db.flush()
    [(key, record)] = db.load()  # the second write replaced the row, not added one
    assert key == models.DeviceKey("drv", "pöol", 'dev\x00 ☃ "q"')
    assert (record.message, record.last_report, record.driver_time) == ("again", T0 + 1, 2**62)
    db.delete([key])
    assert db.load() == []
    db.close()


def test_float_times_keep_every_digit(tmp_path: pathlib.Path) -> None:
    db = store.HealthStore.open(tmp_path)
    healthinfo.HealthCache(sink=db).update(
        "drv", [models.DeviceReport("p", "d", H.HEALTHY)], now=1000001.509765625
    )
    db.close()
    db2 = store.HealthStore.open(tmp_path)
    [(_, record)] = db2.load()
    assert record.last_report == 1000001.509765625
    db2.close()


# -- deletions (kubelet v1.37.2 deletes stale entries) ------------------------------

K = models.DeviceKey("drv", "p", "d")
REC = models.DeviceHealth(H.HEALTHY, "", 30.0, T0)


@pytest.mark.parametrize(
    ("stages", "left"),
    [
        ([("put", REC), ("flush", None), ("delete", None)], False),
        ([("put", REC), ("delete", None)], False),  # never committed: nothing to keep
        ([("put", REC), ("flush", None), ("delete", None), ("put", REC)], True),  # latest wins
        ([("delete", None)], False),  # deleting a missing row is no error
    ],
    ids=["committed-then-deleted", "staged-then-deleted", "deleted-then-put", "missing"],
)
def test_staged_deletions_survive_a_reopen(
    tmp_path: pathlib.Path, stages: list[tuple[str, models.DeviceHealth | None]], left: bool
) -> None:
    db = store.HealthStore.open(tmp_path)
    for op, record in stages:
        if op == "put":
            assert record is not None
            db.stage(K, record)
        elif op == "delete":
            db.stage_delete([K])
        else:
            db.flush()
    db.close()
    again = store.HealthStore.open(tmp_path)
    assert dict(again.load()) == ({K: REC} if left else {})
    again.close()


def test_a_commit_that_fails_after_the_upserts_ran_rolls_back_and_keeps_the_batch(
    tmp_path: pathlib.Path,
) -> None:
    """The fault seam: COMMIT fails once after every upsert of the batch was sent. A reader
    sees none of the batch (the old record), the batch stays staged, and the next flush
    commits all of it (seen failing with the restage in ``_restage`` removed)."""
    db = store.HealthStore.open(tmp_path)
    other = models.DeviceKey("drv", "p", "other")
    db.stage(K, REC)
    db.flush()
    assert db.connection is not None
    db.connection.fail("COMMIT", sqlite3.OperationalError("database or disk is full"))
    newer = models.DeviceHealth(H.HEALTHY, "after", 30.0, T0 + 5)
    db.stage(K, newer)
    db.stage(other, REC)
    with pytest.raises(errors.StoreError, match="disk is full"):
        db.flush()
    assert db.degraded and db.pending == 2
    assert _stored(tmp_path) == {K: REC}
    assert db.flush() == 2 and not db.degraded
    db.close()
    assert _stored(tmp_path) == {K: newer, other: REC}


def _stored(state_dir: pathlib.Path) -> dict[models.DeviceKey, models.DeviceHealth]:
    reader = store.HealthStore.open(state_dir)
    try:
        return dict(reader.load())
    finally:
        reader.close()


def test_a_failed_flush_keeps_staged_deletions(tmp_path: pathlib.Path) -> None:
    db = store.HealthStore.open(tmp_path)
    db.stage(K, REC)
    db.flush()
    db.stage_delete([K])
    assert db.connection is not None
    db.connection.execute("PRAGMA query_only=ON")
    with pytest.raises(errors.StoreError):
        db.flush()
    assert db.pending == 1
    db.connection.execute("PRAGMA query_only=OFF")
    assert db.flush() == 1
    db.close()
    again = store.HealthStore.open(tmp_path)
    assert again.load() == []
    again.close()


# -- the flush and load formats (issue 15) --------------------------------------------

# The statement every flush used before issue 15: a JSON array of [key, value]
# pairs through json_each, the key's text rendered by SQLite's json_extract.
_OLD_UPSERT = (
    'REPLACE INTO "devices" (key, value) '
    "SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?)"
)
ODD_NAMES = [("drv", "pool", "dev-1"), ("gpu.example.com", "pöol/1", 'dev\x00 ☃ "q"\\\n\t')]


@pytest.mark.parametrize("names", ODD_NAMES, ids=["plain", "escapes"])
def test_a_row_of_the_json_each_format_is_updated_in_place_and_deleted(
    tmp_path: pathlib.Path, names: tuple[str, str, str]
) -> None:
    key = models.DeviceKey(*names)
    old = models.DeviceHealth(H.UNHEALTHY, "old", 30.0, T0)
    db = store.HealthStore.open(tmp_path)
    assert db.connection is not None
    payload = json.dumps([[list(key), store._value(key, old)]], ensure_ascii=False)
    db.connection.execute(_OLD_UPSERT, (payload,))
    db.connection.commit()
    new = models.DeviceHealth(H.HEALTHY, "new ✓", 12.5, T0 + 0.1, 7, "/e")
    db.stage(key, new)
    db.flush()
    assert db.load() == [(key, new)]  # the same row, not a second one
    db.stage_delete([key])
    db.flush()
    assert db.load() == []
    db.close()


def test_plain_tuple_keys_stage_as_device_keys(tmp_path: pathlib.Path) -> None:
    db = store.HealthStore.open(tmp_path)
    record = models.DeviceHealth(H.HEALTHY, "", 30.0, T0)
    db.stage(models.DeviceKey("drv", "p", "d"), record._replace(message="first"))
    db.stage_many([(("drv", "p", "d"), record)])  # the hot path stages plain tuples
    assert db.pending == 1
    db.flush()
    assert db.load() == [(models.DeviceKey("drv", "p", "d"), record)]
    db.close()


_GOOD = {"v": 1, "driver": "d", "pool": "p", "device": "x", "health": "Healthy",
         "lease": 30, "last_report": 1.5}  # fmt: skip


@pytest.mark.parametrize(
    "value",
    [
        _GOOD,
        {**_GOOD, "message": "m", "driver_time": 3, "endpoint": "/e", "extra": 1},
        {**_GOOD, "v": 2},
        {**_GOOD, "v": "1"},
        {**_GOOD, "lease": 0},
        {**_GOOD, "lease": "30"},
        {**_GOOD, "health": "Bad"},
        {**_GOOD, "health": "Unknown"},
        {**_GOOD, "message": "x" * 4097},
        {**_GOOD, "message": None},
        {**_GOOD, "driver_time": 1.5},
        {k: v for k, v in _GOOD.items() if k != "pool"},
        {k: v for k, v in _GOOD.items() if k != "last_report"},
    ],
)
def test_the_bulk_row_schema_agrees_with_stored_device(value: dict[str, object]) -> None:
    text = json.dumps(value)
    try:
        expected: object = store.StoredDevice.model_validate_json(text).to_record()
    except ValueError:
        expected = "rejected"
    try:
        [row] = store._ROWS.validate_json(f"[{text}]")
        got: object = store._record_of(row)
    except ValueError:
        got = "rejected"
    assert got == expected

"""The store's encoding: the JSON text of a row, and reading rows back.

``kubelet_dra/state/store.py`` formats each value's JSON text itself
(``_value_text``) instead of ``json.dumps``; these tests hold it to exactly what
``json.dumps`` of the versioned record gives, and check that loading (the bulk
path and the row-by-row path) gives back every field. Written against mutation
testing's survivors (docs/testing.md).
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
import sqlite3
from typing import Any

import pytest

from kubelet_dra import models
from kubelet_dra.state import store

H = models.HealthStatus
T0 = 1_000_000.0

KEYS = [
    ("drv", "pool", "dev-1"),
    ("gpu.example.com", "pöol/1", 'dev\x00 ☃ "q"\\\n\t\u2028'),
]
RECORDS = [
    models.DeviceHealth(H.HEALTHY, "", 30.0, T0),
    models.DeviceHealth(H.UNHEALTHY, 'ECC "✗"\n', 12.5, T0 + 0.123456789, 2**62, "/e ☃"),
    models.DeviceHealth(H.UNKNOWN, "m", 1e-07, 1e22, -1, "/run/x.sock"),
]
# Values json spells otherwise than repr (NaN, Infinity, true): _value_text takes
# json.dumps's way for them.
ODD_RECORDS = [
    models.DeviceHealth(H.HEALTHY, "m", math.inf, T0, 3, "/e"),
    models.DeviceHealth(H.HEALTHY, "m", 30.0, -math.inf, 3, "/e"),
    models.DeviceHealth(H.HEALTHY, "m", 30.0, math.inf, 3, "/e"),
    models.DeviceHealth(H.HEALTHY, "m", 30.0, T0, True, "/e"),
]


@pytest.mark.parametrize("key", KEYS, ids=["plain", "escapes"])
@pytest.mark.parametrize("record", RECORDS, ids=["healthy", "unhealthy", "unknown"])
def test_value_text_is_the_minified_json_of_the_versioned_record(
    key: tuple[str, str, str], record: models.DeviceHealth
) -> None:
    key_text, value_text = store._value_text(key, record)
    assert key_text == json.dumps(list(key), ensure_ascii=False, separators=(",", ":"))
    assert value_text == json.dumps(
        store._value(key, record), ensure_ascii=False, separators=(",", ":")
    )
    assert json.loads(value_text) == {
        "v": 1,
        "driver": key[0],
        "pool": key[1],
        "device": key[2],
        "health": record.health.value,
        "message": record.message,
        "lease": record.lease,
        "last_report": record.last_report,
        "driver_time": record.driver_time,
        "endpoint": record.endpoint,
    }


@pytest.mark.parametrize("record", ODD_RECORDS, ids=["inf-lease", "-inf", "inf", "bool"])
def test_value_text_of_values_json_spells_otherwise_is_json_dumps(
    record: models.DeviceHealth,
) -> None:
    key = KEYS[1]
    key_text, value_text = store._value_text(key, record)
    assert key_text == json.dumps(list(key), ensure_ascii=False, separators=(",", ":"))
    assert value_text == json.dumps(store._value(key, record), ensure_ascii=False)


def test_a_nan_time_is_written_as_json_writes_it() -> None:
    record = models.DeviceHealth(H.HEALTHY, "", 30.0, math.nan)
    _, value_text = store._value_text(KEYS[0], record)
    assert '"last_report": NaN' in value_text
    _, value_text = store._value_text(KEYS[0], record._replace(lease=math.nan))
    assert '"lease": NaN' in value_text


def test_parameters_are_key_then_value_per_row_in_order() -> None:
    chunk = [(KEYS[0], RECORDS[0]), (KEYS[1], RECORDS[1]), (KEYS[0], RECORDS[2])]
    expected: list[str] = []
    for key, record in chunk:
        expected.extend(store._value_text(key, record))
    assert store._parameters(chunk) == expected
    assert store._parameters([]) == []


def test_upsert_inserts_new_rows_and_updates_known_ones_in_place() -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute('CREATE TABLE "devices" (key TEXT PRIMARY KEY, value BLOB)')
    first = [(KEYS[0], RECORDS[0]), (KEYS[1], RECORDS[1])]
    conn.execute(store._upsert(2), store._parameters(first))
    rowids = dict(conn.execute('SELECT key, rowid FROM "devices"').fetchall())
    again = [(KEYS[1], RECORDS[2]), (("a", "b", "c"), RECORDS[0]), (KEYS[0], RECORDS[2])]
    conn.execute(store._upsert(3), store._parameters(again))
    rows = conn.execute('SELECT key, rowid, value FROM "devices" ORDER BY rowid').fetchall()
    # the key is SQLite's own minified rendering (what _DELETE compares with)
    keys = [
        json.dumps(list(k), ensure_ascii=False, separators=(",", ":"))
        for k in (KEYS[0], KEYS[1], ("a", "b", "c"))
    ]
    assert [key for key, _, _ in rows] == keys
    assert [rowid for _, rowid, _ in rows[:2]] == [rowids[keys[0]], rowids[keys[1]]]  # in place
    assert [json.loads(value)["health"] for _, _, value in rows] == [
        "Unknown",
        "Unknown",
        "Healthy",
    ]
    conn.close()


def write(db: store.HealthStore, rows: dict[models.DeviceKey, models.DeviceHealth]) -> None:
    db.stage_many(rows.items())
    db.flush()


def many(count: int) -> dict[models.DeviceKey, models.DeviceHealth]:
    return {
        models.DeviceKey("drv", f"p{i % 3}", f"d{i}"): models.DeviceHealth(
            [H.HEALTHY, H.UNHEALTHY, H.UNKNOWN][i % 3], f"m{i}", 1.0 + i, T0 + i, i, f"/e{i}"
        )
        for i in range(count)
    }


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 5000])
def test_the_bulk_load_reads_every_row_once_in_chunks(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr(store, "CHUNK_LOAD", chunk)
    rows = many(7)
    db = store.HealthStore.open(tmp_path)
    write(db, rows)
    assert chunks(db) == list(rows.items())  # the fast path, not the fallback
    assert db.load() == list(rows.items())
    assert db.skipped_rows == 0
    db.close()


def test_the_bulk_load_of_an_empty_file_is_empty(tmp_path: pathlib.Path) -> None:
    db = store.HealthStore.open(tmp_path)
    assert chunks(db) == []
    assert db.load() == []
    db.close()


def test_rows_written_in_many_statements_all_arrive(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "CHUNK", 2)
    rows = many(5)
    db = store.HealthStore.open(tmp_path)
    write(db, rows)
    assert dict(db.load()) == rows
    db.close()


def _read(db: store.HealthStore, how: Any) -> list[Any]:
    """What a loader reads, on a read-only connection of its own (as ``load`` does)."""
    conn = sqlite3.connect(db.path.absolute().as_uri() + "?mode=ro", uri=True)
    try:
        return list(how(conn))
    finally:
        conn.close()


def chunks(db: store.HealthStore) -> list[Any]:
    """The bulk path alone (it raises where ``load`` falls back to rows)."""
    return _read(db, db._load_chunks)


def rows_one_by_one(db: store.HealthStore) -> list[Any]:
    """The row-by-row path alone."""
    return _read(db, db._load_rows)


def raw_rows(db: store.HealthStore, values: list[str]) -> None:
    assert db.connection is not None
    for i, value in enumerate(values):
        db.connection.execute(
            'INSERT INTO "devices" (key, value) VALUES (?, ?)',
            (json.dumps(["d", "p", str(i)]), value),
        )
    db.connection.commit()


def test_a_value_holding_two_objects_fails_the_bulk_path_and_is_skipped(
    tmp_path: pathlib.Path,
) -> None:
    good = store._value_text(("d", "p", "0"), RECORDS[1])[1]
    db = store.HealthStore.open(tmp_path)
    raw_rows(db, [good, f"{good},{good}"])
    with pytest.raises(ValueError):  # load() catches it and reads row by row
        chunks(db)
    assert db.load() == [(models.DeviceKey("d", "p", "0"), RECORDS[1])]
    assert db.skipped_rows == 1
    db.close()


def test_every_bad_row_is_counted_and_logged(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = store._value_text(("d", "p", "0"), RECORDS[2])[1]
    db = store.HealthStore.open(tmp_path)
    raw_rows(db, [good, "{", '{"v": 1}', "[]"])
    with caplog.at_level(logging.WARNING, logger="kubelet_dra.state.store"):
        assert db.load() == [(models.DeviceKey("d", "p", "0"), RECORDS[2])]
    assert db.skipped_rows == 3
    skipped = [
        r
        for r in caplog.records
        if r.getMessage().startswith("skipping unreadable health record: ")
    ]
    assert len(skipped) == 3
    assert all(r.levelno == logging.WARNING for r in skipped)
    # each line says why: pydantic's reason for the row
    assert all("for StoredDevice" in r.getMessage() for r in skipped)
    db.close()


def test_the_row_by_row_path_reads_every_field(tmp_path: pathlib.Path) -> None:
    # A NULL value spoils the bulk path (the count check), so the whole file is read
    # row by row through StoredDevice.
    db = store.HealthStore.open(tmp_path)
    rows = many(4)
    write(db, rows)
    assert db.connection is not None
    db.connection.execute('INSERT INTO "devices" (key, value) VALUES (?, NULL)', ('["x","y","z"]',))
    db.connection.commit()
    assert dict(db.load()) == rows
    assert db.skipped_rows == 1
    db.close()


def test_a_read_only_load_reads_every_field(tmp_path: pathlib.Path) -> None:
    rows = many(3)
    db = store.HealthStore.open(tmp_path)
    write(db, rows)
    db.close()
    unopened = store.HealthStore(tmp_path / store.FILE_NAME, db=None)
    assert dict(unopened.load()) == rows
    conn = sqlite3.connect(tmp_path / store.FILE_NAME)
    conn.execute("UPDATE devices SET value = 'garbage' WHERE rowid = 1")
    conn.commit()
    conn.close()
    assert len(unopened.load()) == 2
    assert unopened.skipped_rows == 1


@pytest.mark.parametrize(
    ("absent", "default"),
    [("message", ""), ("driver_time", 0), ("endpoint", "")],
)
def test_a_row_without_an_optional_field_reads_its_default(
    tmp_path: pathlib.Path, absent: str, default: object
) -> None:
    value = store._value(("d", "p", "x"), RECORDS[1])
    del value[absent]
    db = store.HealthStore.open(tmp_path)
    raw_rows(db, [json.dumps(value)])
    [(_, record)] = chunks(db)
    assert getattr(record, absent) == default
    [(_, record)] = rows_one_by_one(db)
    assert getattr(record, absent) == default
    db.close()

"""Bad cache files: random bytes, truncation at every offset, old and future schemas.

Whatever is in ``health.sqlite`` (and its ``-wal``), :meth:`store.HealthStore.open`
never raises and never crash-loops: an unreadable file is moved aside and the
cache starts empty, a readable one loads only records that validate. Checked
with hypothesis (random bytes, random bytes after a valid SQLite header) and
a small valid file (page size 512) cut at a deterministic sample of offsets (the
header, each page boundary, the last page); the long versions (``-m slow``) cut it,
and a default-page-size file, at every offset.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import shutil
import sqlite3
from collections.abc import Callable, Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubelet_dra import models
from kubelet_dra.state import healthinfo, store

H = models.HealthStatus
SQLITE_HEADER = b"SQLite format 3\x00"


def _valid_file(directory: pathlib.Path, *, page_size: int | None, devices: int = 5) -> bytes:
    """A checkpointed, closed store holding ``devices`` records; returns its bytes."""
    path = directory / store.FILE_NAME
    if page_size is not None:
        conn = sqlite3.connect(path)
        conn.execute(f"PRAGMA page_size={page_size}")
        conn.execute("VACUUM")
        conn.close()
    db = store.HealthStore.open(directory)
    cache = healthinfo.HealthCache(sink=db)
    reports = [models.DeviceReport("p", f"d{i}", H.HEALTHY, "ok", 30) for i in range(devices)]
    cache.update("drv", reports, now=1_000_000.0, endpoint="/e")
    db.close()
    assert not (directory / f"{store.FILE_NAME}-wal").exists()
    return path.read_bytes()


def _open_checked(
    directory: pathlib.Path,
) -> tuple[store.HealthStore, list[tuple[models.DeviceKey, models.DeviceHealth]]]:
    db = store.HealthStore.open(directory)
    assert not db.degraded
    records = db.load()
    for key, record in records:  # every record that loads is a valid one
        store.StoredDevice.model_validate(store._value(key, record))
    return db, records


def _reset(directory: pathlib.Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    # Module scope: hypothesis runs every example in one call of the test function.
    return tmp_path_factory.mktemp("kdcache")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=4096), st.binary(max_size=4096).map(SQLITE_HEADER.__add__)))
def test_random_bytes_never_crash_open(scratch: pathlib.Path, blob: bytes) -> None:
    _reset(scratch)
    (scratch / store.FILE_NAME).write_bytes(blob)
    db, _ = _open_checked(scratch)
    db.close()


Outcomes = collections.Counter[tuple[bool, int]]  # (moved aside, records loaded) -> offsets


def _truncations(
    tmp_path: pathlib.Path, page_size: int | None, offsets: Callable[[int], Iterable[int]]
) -> tuple[int, Outcomes]:
    """Open the valid file cut at each of ``offsets(size)``; count what each cut gave."""
    source = tmp_path / "source"
    source.mkdir()
    data = _valid_file(source, page_size=page_size)
    work = tmp_path / "work"
    outcomes: Outcomes = collections.Counter()
    for offset in sorted({o for o in offsets(len(data)) if 0 <= o <= len(data)}):
        _reset(work)
        (work / store.FILE_NAME).write_bytes(data[:offset])
        db, records = _open_checked(work)
        db.close()
        moved = db.moved_aside is not None
        assert not (moved and records), f"cut at {offset}: moved aside, yet loaded {records}"
        if offset == len(data):
            assert (moved, len(records)) == (False, 5), f"the uncut file: {moved=} {records=}"
        outcomes[moved, len(records)] += 1
    return len(data), outcomes


def _assert_cuts_lose_only_what_they_cut(outcomes: Outcomes) -> None:
    """Unreadable cuts are moved aside; a cut inside the last records' page keeps the
    records before it (the file is not thrown away for one bad record); only the uncut
    file holds all five."""
    moved = outcomes[True, 0]
    partial = sum(
        n for (was_moved, count), n in outcomes.items() if not was_moved and 0 < count < 5
    )
    full = outcomes[False, 5]
    assert moved > 0, outcomes
    assert partial > 0, outcomes
    assert full == 1, outcomes


def every_offset(size: int) -> range:
    return range(size + 1)


def sampled_offsets(size: int) -> list[int]:
    """A deterministic sample: the header, both sides of every page boundary of the 512-byte
    pages, every 61st byte, and the last page every 16 bytes (~150 opens, not ~4 100)."""
    header = range(0, 101)
    boundaries = (b + d for b in range(512, size + 1, 512) for d in (-1, 0, 1))
    return [*header, *boundaries, *range(0, size, 61), *range(size - 512, size + 1, 16)]


def test_truncation_at_sampled_offsets_of_a_small_valid_file(tmp_path: pathlib.Path) -> None:
    # Each offset is a full open (about 60 ms on a loaded CI machine); the slow version
    # below takes every one of the ~4 100.
    size, outcomes = _truncations(tmp_path, page_size=512, offsets=sampled_offsets)
    print(f"\ntruncated a {size}-byte cache at {outcomes.total()} offsets: {dict(outcomes)}")
    _assert_cuts_lose_only_what_they_cut(outcomes)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_truncation_at_every_offset_of_a_small_valid_file(tmp_path: pathlib.Path) -> None:
    size, outcomes = _truncations(tmp_path, page_size=512, offsets=every_offset)
    print(f"\ntruncated a {size}-byte cache at every offset: {dict(outcomes)}")
    _assert_cuts_lose_only_what_they_cut(outcomes)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 20 480 opens: about 5 minutes on 2 idle cores
def test_truncation_at_every_offset_of_a_default_page_size_file(tmp_path: pathlib.Path) -> None:
    size, outcomes = _truncations(tmp_path, page_size=None, offsets=every_offset)
    print(f"\ntruncated a {size}-byte cache at every offset: {dict(outcomes)}")
    # Which cuts keep which records depends on where SQLite put them in its few 4 KiB
    # pages; what holds for any layout: the uncut file loads (checked in _truncations),
    # no cut is loaded and moved aside at once, and some cuts are moved aside.
    assert outcomes[True, 0] > 0, outcomes


def test_truncated_wal_of_a_killed_writer_opens(tmp_path: pathlib.Path) -> None:
    """A WAL cut anywhere (a crash mid-append) yields a prefix of commits, never an error."""
    source = tmp_path / "source"
    db = store.HealthStore.open(source)
    cache = healthinfo.HealthCache(sink=db)
    for k in range(3):
        cache.update("drv", [models.DeviceReport("p", "d", H.HEALTHY, str(k), 30)], now=1e6 + k)
        db.flush()
    main = (source / store.FILE_NAME).read_bytes()
    wal = (source / f"{store.FILE_NAME}-wal").read_bytes()
    assert db.connection is not None
    db.connection.close()  # leave the WAL as a SIGKILL would
    work = tmp_path / "work"
    seen = set()
    for offset in range(0, len(wal), 97):
        _reset(work)
        (work / store.FILE_NAME).write_bytes(main)
        (work / f"{store.FILE_NAME}-wal").write_bytes(wal[:offset])
        again, records = _open_checked(work)
        seen |= {r.message for _, r in records}
        again.close()
    assert seen <= {"0", "1", "2"}


@pytest.mark.parametrize(
    ("version", "accepted"),
    [
        pytest.param(None, True, id="no-meta-table"),
        pytest.param(1, True, id="current"),
        pytest.param(0, False, id="old-0"),
        pytest.param(2, False, id="future-2"),
        pytest.param(99, False, id="future-99"),
        pytest.param("one", False, id="not-a-number"),
        pytest.param("{", False, id="not-json"),
    ],
)
def test_schema_versions(tmp_path: pathlib.Path, version: object, accepted: bool) -> None:
    _valid_file(tmp_path, page_size=None)
    conn = sqlite3.connect(tmp_path / store.FILE_NAME)
    if version is None:
        conn.execute('DROP TABLE "meta"')
    else:
        value = version if version == "{" else json.dumps(version)
        conn.execute('UPDATE "meta" SET value = ? WHERE key = ?', (value, "schema"))
    conn.commit()
    conn.close()
    db, records = _open_checked(tmp_path)
    db.close()
    assert (db.moved_aside is None) is accepted
    assert len(records) == (5 if accepted else 0)


@dataclasses.dataclass(frozen=True)
class _RawValue:
    """A stored value given as text (or NULL), not as an object to encode."""

    text: str | None


@pytest.mark.parametrize(
    "row",
    [
        pytest.param({"v": 2, "driver": "drv", "pool": "p", "device": "x"}, id="future-row"),
        pytest.param({"v": 1}, id="missing-fields"),
        pytest.param([1, 2, 3], id="not-an-object"),
        pytest.param({"v": 1, "driver": "drv", "pool": "p", "device": "x", "health": "Bad",
                      "lease": 30, "last_report": 1}, id="bad-enum"),
        pytest.param({"v": 1, "driver": "drv", "pool": "p", "device": "x", "health": "Healthy",
                      "lease": -1, "last_report": 1}, id="negative-lease"),
        # The bulk load joins values as text: one that is not exactly one
        # object must not read as two records, or vanish unnoticed.
        pytest.param(_RawValue('{"v": 1, "driver": "drv", "pool": "p", "device": "x", '
                               '"health": "Healthy", "lease": 30, "last_report": 1},'
                               '{"v": 1, "driver": "drv", "pool": "p", "device": "y", '
                               '"health": "Healthy", "lease": 30, "last_report": 1}'),
                     id="two-objects-in-one-value"),
        pytest.param(_RawValue(None), id="null-value"),
        pytest.param(_RawValue(""), id="empty-value"),
    ],
)  # fmt: skip
def test_bad_rows_are_skipped_and_counted(tmp_path: pathlib.Path, row: object) -> None:
    _valid_file(tmp_path, page_size=None)
    conn = sqlite3.connect(tmp_path / store.FILE_NAME)
    value = row.text if isinstance(row, _RawValue) else json.dumps(row)
    conn.execute('INSERT INTO "devices" (key, value) VALUES (?, ?)', ("bad", value))
    conn.commit()
    conn.close()
    db, records = _open_checked(tmp_path)
    db.close()
    assert len(records) == 5 and db.skipped_rows == 1

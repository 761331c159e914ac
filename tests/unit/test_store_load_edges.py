"""Loading the store at its edges: values that are not JSON each but join into
records, a NULL value's log line, and a page found corrupt in the middle of a scan.

``HealthStore.load`` reads in bulk (values joined into one JSON array) and falls back
to reading row by row, skipping and logging each bad row; a read error in the middle
of the row-by-row scan keeps the records read so far and logs how many. Written
against mutation testing's survivors in ``_load_chunks`` and ``_load_rows``
(docs/testing.md); every test uses a real SQLite file under ``tmp_path``.
"""

from __future__ import annotations

import logging
import pathlib
import re
import sqlite3
import struct

import pytest

from kubelet_dra import models
from kubelet_dra.state import store

H = models.HealthStatus
T0 = 1_000_000.0
LOGGER = "kubelet_dra.state.store"


def key(i: int) -> models.DeviceKey:
    return models.DeviceKey("drv", "p", f"d{i:03}")


def record(i: int) -> models.DeviceHealth:
    return models.DeviceHealth(H.HEALTHY, f"m{i}", 30.0, T0 + i, i, "/e")


def value(i: int) -> str:
    """The JSON text the store writes for device ``i``."""
    return store._value_text(key(i), record(i))[1]


def raw_rows(db: store.HealthStore, values: list[str | None]) -> None:
    """Insert ``values`` as they are (text or NULL), in this rowid order."""
    assert db.connection is not None
    for i, text in enumerate(values):
        db.connection.execute(
            'INSERT INTO "devices" (key, value) VALUES (?, ?)', (f'["raw","p","{i}"]', text)
        )
    db.connection.commit()


def test_values_that_are_json_only_when_joined_are_skipped_not_read(
    tmp_path: pathlib.Path,
) -> None:
    # The first bad value ends with the head of an object, the second holds its tail:
    # joined with "," they give two whole records for two rows, so only the check that
    # every value is JSON on its own sends the chunk to the row-by-row path.
    second = value(2)
    head, tail = second.split(",", 1)  # '{"v":1' and the rest of the object
    db = store.HealthStore.open(tmp_path)
    raw_rows(db, [value(0), f"{value(1)},{head}", tail])
    assert db.load() == [(key(0), record(0))]
    assert db.skipped_rows == 2
    db.close()


def test_a_null_value_is_logged_as_empty_input(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The warning says what was refused: a NULL value is read as empty bytes.
    db = store.HealthStore.open(tmp_path)
    raw_rows(db, [value(0), None])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert db.load() == [(key(0), record(0))]
    assert db.skipped_rows == 1
    [line] = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert line.startswith("skipping unreadable health record: ")
    assert "EOF while parsing a value at line 1 column 0" in line
    assert "input_value=b''" in line
    db.close()


def _zero_last_leaf(path: pathlib.Path) -> int:
    """Zero the table's rightmost leaf page (its newest rows); return how many rows it held.

    The table must span several pages: its root is then an interior page, whose
    right-most child pointer (header bytes 8-11) names the last leaf.
    """
    conn = sqlite3.connect(path)
    try:
        page_size: int = conn.execute("PRAGMA page_size").fetchone()[0]
        root: int = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = ?", ("devices",)
        ).fetchone()[0]
    finally:
        conn.close()
    with path.open("r+b") as f:
        f.seek((root - 1) * page_size)
        header = f.read(12)
        assert header[0] == 0x05, "the table is one page: no leaf to corrupt"
        (last,) = struct.unpack(">I", header[8:12])
        f.seek((last - 1) * page_size)
        leaf = f.read(5)
        assert leaf[0] == 0x0D, "not a table leaf page"
        (cells,) = struct.unpack(">H", leaf[3:5])
        f.seek((last - 1) * page_size)
        f.write(bytes(page_size))
    return int(cells)


def test_a_page_corrupt_mid_scan_keeps_the_records_before_it_and_says_how_many(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    count = 60  # about 14 rows a 4 KiB page: several leaves
    written = [(key(i), record(i)) for i in range(count)]
    db = store.HealthStore.open(tmp_path)
    db.stage_many(written)
    db.flush()
    db.close()
    # Opened (its integrity checked) first, damaged after: the page goes bad under a
    # store that is open for writing, so load() reads row by row, not read-only.
    db = store.HealthStore.open(tmp_path)
    assert db.connection is not None
    lost = _zero_last_leaf(db.path)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        loaded = db.load()
    # Every row before the bad page, in order (sqlite3 reads one row ahead, so the
    # row just before the page may go with it); none after it.
    assert count - lost - 1 <= len(loaded) <= count - lost
    assert loaded == written[: len(loaded)]
    assert db.skipped_rows == 0
    [stop] = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
    assert re.fullmatch(
        rf"health cache {re.escape(str(db.path))}: reading stopped after {len(loaded)} "
        r"records \(database disk image is malformed\); keeping those",
        stop.getMessage(),
    ), stop.getMessage()
    db.close()

"""Fuzz target: loading our state file (``kubelet_dra.state.store.HealthStore``).

Counterpart of the kubelet's ``dra_health_state`` loader
(``pkg/kubelet/cm/dra/healthinfo.go`` ``loadFromCheckpoint``). Two inputs:

- rows (the first byte is not ``\\xff``): the rest, split at ``\\0``, are the
  values of the ``devices`` table, written with plain sqlite3 into a real
  store's file (a part starting ``\\x01`` is stored as a BLOB, a part that is
  just ``\\x02`` as NULL). ``load()`` must return exactly the rows that
  validate one by one as ``StoredDevice``, in file order, and count the others
  in ``skipped_rows``: the fast chunked path and the row-by-row path agree,
  and no row is read that alone would be refused.
- a whole file (``\\xff`` then the file's bytes): ``HealthStore.open`` never
  raises but ``StoreError``; an unreadable file is moved aside; what opens
  loads without raising, takes a record, and gives it back after a close and
  a reopen (the state file works again after any file it found).
"""

from __future__ import annotations

import atexit
import json
import pathlib
import shutil
import sqlite3
import tempfile

from tests.fuzz import _harness

with _harness.instrumented(__name__ == "__main__"):
    from kubelet_dra import errors, models
    from kubelet_dra.state import store

# On tmpfs where there is one: the property is about what is read back, and a
# disk's fsync per input would make this target a hundred times slower.
_SHM = pathlib.Path("/dev/shm")
_TMP = pathlib.Path(tempfile.mkdtemp(prefix="fuzz-store-", dir=_SHM if _SHM.is_dir() else None))
atexit.register(shutil.rmtree, _TMP, True)
_ROWS_DIR = _TMP / "rows"
_FILE_DIR = _TMP / "file"
_KEY = models.DeviceKey("gpu.example.com", "pool", "dev")
_RECORD = models.DeviceHealth(models.HealthStatus.UNHEALTHY, "XID 79", 30.0, 1000.0, 7, "/e.sock")
_store: store.HealthStore | None = None


def _rows_store() -> store.HealthStore:
    global _store
    if _store is None:
        _store = store.HealthStore.open(_ROWS_DIR)
    return _store


def _value(part: bytes) -> object:
    if part == b"\x02":
        return None
    if part.startswith(b"\x01"):
        return part[1:]
    return part.decode("utf-8", "replace")


def _alone(value: object) -> tuple[models.DeviceKey, models.DeviceHealth] | None:
    try:
        return store.StoredDevice.model_validate_json(value).to_record()  # type: ignore[arg-type]
    except (ValueError, TypeError):
        return None


def _rows(data: bytes) -> None:
    values = [_value(part) for part in data.split(b"\0")]
    health = _rows_store()
    conn = sqlite3.connect(health.path)
    try:
        conn.execute('DELETE FROM "devices"')
        conn.executemany(
            'INSERT INTO "devices" (key, value) VALUES (?, ?)',
            [(json.dumps(["d", "p", str(i)]), v) for i, v in enumerate(values)],
        )
        conn.commit()
    finally:
        conn.close()
    expected = [row for row in map(_alone, values) if row is not None]
    skipped = health.skipped_rows
    loaded = health.load()
    assert loaded == expected, (values, loaded, expected)
    if len(expected) < len(values):
        assert health.skipped_rows - skipped == len(values) - len(expected)


def _file(data: bytes) -> None:
    shutil.rmtree(_FILE_DIR, ignore_errors=True)
    _FILE_DIR.mkdir(mode=0o700)
    (_FILE_DIR / store.FILE_NAME).write_bytes(data)
    try:
        health = store.HealthStore.open(_FILE_DIR)
    except errors.StoreError:
        return
    try:
        health.load()
        health.stage(_KEY, _RECORD)
        assert health.flush() == 1, health.last_error
    finally:
        health.close()
    again = store.HealthStore.open(_FILE_DIR)
    try:
        assert again.moved_aside is None, "a file we wrote was refused"
        assert (_KEY, _RECORD) in again.load()
    finally:
        again.close()


def test_one(data: bytes) -> None:
    if data.startswith(b"\xff"):
        _file(data[1:])
    else:
        _rows(data)


if __name__ == "__main__":
    _harness.main(test_one, __file__)

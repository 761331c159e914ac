"""Persistence of the health cache on sqlitedict (SQLite), restart-safe.

Counterpart of the kubelet's ``dra_health_state`` file, which is the whole
cache as JSON rewritten (temp file + rename, no fsync) on every change. Here:

- one SQLite file, opened through sqlitedict, in WAL mode with
  ``synchronous=NORMAL``: a committed batch survives a crash of the process
  (SIGKILL) and the file is never torn; after a power loss at most the last
  batches are lost, never the file. sqlitedict hard-codes ``synchronous=OFF``
  (not safe against power loss), so we set the level ourselves after opening;
- values are versioned JSON (``StoredDevice``), never pickles;
- writes are staged in memory (the latest record per device wins) and
  committed in one transaction by :meth:`HealthStore.flush`, so a flood of
  reports costs one commit per flush, not per device. The batch is sent to
  SQLite as a single JSON argument (``json_each``) instead of sqlitedict's
  one-queue-round-trip-per-row ``update``;
- lease renewals are stored too (the kubelet stores only changes), so after a
  restart a device whose lease has not run out is still valid;
- a file that cannot be read (garbage, truncation, a schema we do not know)
  is moved aside with a clear error and the cache starts empty: the process
  never crash-loops on its own state;
- a failing flush (read-only or full disk, file deleted) keeps the staged
  records in memory, reports ``degraded`` and succeeds again when it can.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import sqlite3
import threading
import time
from collections.abc import Iterator

import pydantic
import sqlitedict

from kubelet_dra import errors, models

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
FILE_NAME = "health.sqlite"
_TABLE = "devices"
_META = "meta"

_UPSERT = (
    f'REPLACE INTO "{_TABLE}" (key, value) '
    "SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?)"
)
_DELETE = f'DELETE FROM "{_TABLE}" WHERE key IN (SELECT value FROM json_each(?))'
_LOAD_ALL = f'SELECT json_group_array(json_array(key, json(value))) FROM "{_TABLE}"'
_LOAD_ROWS = f'SELECT key, value FROM "{_TABLE}"'


class StoredDevice(pydantic.BaseModel):
    """One device record as it is written to disk (schema version 1)."""

    model_config = pydantic.ConfigDict(frozen=True, extra="ignore")

    v: int
    driver: str
    pool: str
    device: str
    health: models.HealthStatus
    message: str = pydantic.Field(default="", max_length=4096)
    lease: float = pydantic.Field(gt=0)
    last_report: float
    driver_time: int = 0
    endpoint: str = ""

    @classmethod
    def of(cls, key: models.DeviceKey, record: models.DeviceHealth) -> StoredDevice:
        return cls.model_construct(
            v=SCHEMA_VERSION,
            driver=key.driver,
            pool=key.pool,
            device=key.device,
            health=record.health,
            message=record.message,
            lease=record.lease,
            last_report=record.last_report,
            driver_time=record.driver_time,
            endpoint=record.endpoint,
        )

    def to_record(self) -> tuple[models.DeviceKey, models.DeviceHealth]:
        key = models.DeviceKey(self.driver, self.pool, self.device)
        record = models.DeviceHealth(
            health=self.health,
            message=self.message,
            lease=self.lease,
            last_report=self.last_report,
            driver_time=self.driver_time,
            endpoint=self.endpoint,
        )
        return key, record


_ROWS = pydantic.TypeAdapter(list[tuple[str, StoredDevice]])


def encode_key(key: models.DeviceKey) -> str:
    # A JSON array: any byte a driver puts in a name round-trips.
    return json.dumps(list(key), ensure_ascii=False)


def _encode_value(key: models.DeviceKey, record: models.DeviceHealth) -> str:
    return json.dumps(
        {
            "v": SCHEMA_VERSION,
            "driver": key.driver,
            "pool": key.pool,
            "device": key.device,
            "health": record.health.value,
            "message": record.message,
            "lease": record.lease,
            "last_report": record.last_report,
            "driver_time": record.driver_time,
            "endpoint": record.endpoint,
        },
        ensure_ascii=False,
    )


class HealthStore:
    """The on-disk health cache. Thread-safe; blocking calls (use a thread)."""

    def __init__(self, path: pathlib.Path, *, db: sqlitedict.SqliteDict) -> None:
        self.path = path
        self._db = db
        self._lock = threading.Lock()
        self._pending: dict[models.DeviceKey, models.DeviceHealth] = {}
        self.moved_aside: pathlib.Path | None = None
        self.skipped_rows = 0
        self.last_error: str | None = None
        self.commits = 0

    # -- opening -----------------------------------------------------------

    @classmethod
    def open(cls, state_dir: pathlib.Path | str) -> HealthStore:
        """Open (or create) the store in ``state_dir``.

        An unreadable file is moved aside to ``<name>.corrupt-<unix time>``
        with an error log, and an empty store is opened in its place.
        """
        directory = pathlib.Path(state_dir)
        _make_private_dir(directory)
        path = directory / FILE_NAME
        try:
            return cls(path, db=_open_db(path))
        except (sqlite3.DatabaseError, errors.StoreError) as exc:
            aside = _move_aside(path)
            logger.error(
                "health cache %s is unreadable (%s); moved it to %s and starting empty",
                path,
                exc,
                aside.name,
            )
        try:
            store = cls(path, db=_open_db(path))
        except sqlite3.Error as exc:
            raise errors.StoreError(f"cannot create health cache {path}: {exc}") from exc
        store.moved_aside = aside
        return store

    # -- reading -----------------------------------------------------------

    def load(self) -> list[tuple[models.DeviceKey, models.DeviceHealth]]:
        """Every stored record. Rows that do not validate are skipped and counted."""
        try:
            row = self._db.conn.select_one(_LOAD_ALL)
            stored = _ROWS.validate_json(row[0] if row and row[0] else "[]")
            return [device.to_record() for _, device in stored]
        except (sqlite3.Error, pydantic.ValidationError, ValueError):
            # One bad row spoils the fast path; read row by row and skip it.
            return list(self._load_rows())

    def _load_rows(self) -> Iterator[tuple[models.DeviceKey, models.DeviceHealth]]:
        for _key, value in self._db.conn.select(_LOAD_ROWS):
            try:
                yield StoredDevice.model_validate_json(value).to_record()
            except (pydantic.ValidationError, ValueError, TypeError) as exc:
                self.skipped_rows += 1
                logger.warning("skipping unreadable health record: %s", exc)

    # -- writing -----------------------------------------------------------

    def stage(self, key: models.DeviceKey, record: models.DeviceHealth) -> None:
        """Queue a record for the next flush; the latest per device wins."""
        with self._lock:
            self._pending[key] = record

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def degraded(self) -> bool:
        """True while the last flush failed and records wait in memory."""
        return self.last_error is not None

    def flush(self) -> int:
        """Commit everything staged in one transaction; return how many rows.

        On failure the batch stays staged (newer stages win over it), the
        error is kept in :attr:`last_error`, and :class:`errors.StoreError`
        is raised; the next flush tries again.
        """
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return 0
        rows = [[encode_key(k), _encode_value(k, r)] for k, r in batch.items()]
        try:
            self._db.conn.execute(_UPSERT, (json.dumps(rows, ensure_ascii=False),))
            self._db.commit(blocking=True)
        except Exception as exc:  # sqlite3 errors arrive re-raised from sqlitedict's thread
            self._restage(batch)
            self.last_error = str(exc)
            raise errors.StoreError(f"cannot write health cache {self.path}: {exc}") from exc
        self.commits += 1
        self.last_error = None
        return len(rows)

    def _restage(self, batch: dict[models.DeviceKey, models.DeviceHealth]) -> None:
        with self._lock:
            batch.update(self._pending)
            self._pending = batch
        self._rollback()

    def _rollback(self) -> None:
        try:
            self._db.conn.execute("ROLLBACK")
            self._db.commit(blocking=True)
        except Exception:  # nothing to roll back, or the connection is gone
            logger.debug("rollback after failed flush did not apply", exc_info=True)

    def delete(self, keys: list[models.DeviceKey]) -> None:
        """Remove records now (used by ``cache`` maintenance commands)."""
        payload = json.dumps([encode_key(k) for k in keys], ensure_ascii=False)
        self._db.conn.execute(_DELETE, (payload,))
        self._db.commit(blocking=True)

    def close(self) -> None:
        """Flush what is staged (best effort) and close the file."""
        try:
            self.flush()
        except errors.StoreError as exc:
            logger.error("health cache not flushed at close: %s", exc)
        self._db.close()


def _make_private_dir(directory: pathlib.Path) -> None:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise errors.StoreError(f"cannot create state directory {directory}: {exc}") from exc


def _open_db(path: pathlib.Path) -> sqlitedict.SqliteDict:
    if path.exists():
        _verify(path)
    else:
        # Create it 0600 ourselves: SQLite would use the umask, and gives the
        # -wal and -shm files the main file's mode.
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    _write_schema(path)
    db = sqlitedict.SqliteDict(
        str(path),
        tablename=_TABLE,
        journal_mode="WAL",
        autocommit=False,
        encode=json.dumps,
        decode=json.loads,
        outer_stack=False,
    )
    db.conn.execute("PRAGMA synchronous=NORMAL")
    return db


def _verify(path: pathlib.Path) -> None:
    """Check an existing file with plain sqlite3 before sqlitedict's thread sees it.

    sqlitedict reports a bad file from its worker thread (an unhandled thread
    exception); checking here first gives one clear error instead.
    """
    conn = sqlite3.connect(path)
    try:
        check = conn.execute("PRAGMA quick_check").fetchone()
        if not check or check[0] != "ok":
            raise errors.StoreError(f"integrity check failed: {check}")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if _META not in tables:
            return
        row = conn.execute(f'SELECT value FROM "{_META}" WHERE key = ?', ("schema",)).fetchone()
        version = json.loads(row[0]) if row else None
        if version not in (None, SCHEMA_VERSION):
            raise errors.StoreError(
                f"schema version {version!r}, this build reads version {SCHEMA_VERSION}"
            )
    except ValueError as exc:
        raise errors.StoreError(f"unreadable schema version: {exc}") from exc
    finally:
        conn.close()


def _write_schema(path: pathlib.Path) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        # The same table shape sqlitedict creates, so sqlitedict can read it too.
        conn.execute(f'CREATE TABLE IF NOT EXISTS "{_META}" (key TEXT PRIMARY KEY, value BLOB)')
        conn.execute(
            f'INSERT OR IGNORE INTO "{_META}" (key, value) VALUES (?, ?)',
            ("schema", json.dumps(SCHEMA_VERSION)),
        )
        conn.commit()
    finally:
        conn.close()


def _move_aside(path: pathlib.Path) -> pathlib.Path:
    aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    for suffix in ("", "-wal", "-shm"):
        src = path.with_name(path.name + suffix)
        if src.exists():
            os.replace(src, aside.with_name(aside.name + suffix))
    return aside

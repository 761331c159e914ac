"""Persistence of the health cache on sqlitedict (SQLite), restart-safe.

Counterpart of the kubelet's ``dra_health_state`` file, which is the whole cache as JSON
rewritten (temp file + rename, no fsync) on every change. :class:`HealthStore` is one SQLite
file in WAL mode with ``synchronous=FULL``, versioned JSON values, staged writes committed
in one transaction per flush, and a file that cannot be read moved aside, never
crash-looped on; its docstring has each rule. Decision record:
``docs/decisions/0001-sqlite-state-file.md``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import pathlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, Any, NotRequired

import pydantic
import sqlitedict
from typing_extensions import TypedDict

from kubelet_dra import errors, models
from kubelet_dra.state import healthinfo

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
FILE_NAME = "health.sqlite"
_TABLE = "devices"
CHUNK = 500
"""Rows per statement in a flush (all statements of a flush are one transaction)."""
CHUNK_LOAD = 5000
"""Rows per query when loading."""
_META = "meta"
SYNCHRONOUS = "FULL"
"""SQLite's ``synchronous`` level: FULL syncs the WAL at every commit, so a
committed batch survives a power loss too. NORMAL syncs it only before a
checkpoint and lost up to a whole WAL of commits (tests/powerloss,
docs/reliability.md "Power loss")."""


# A batch travels as multi-row statements with bound parameters: SQLite
# binds them in C and parses no JSON. The key goes through json() so its text
# is SQLite's own minified rendering, exactly what _DELETE compares with and
# what earlier versions (which sent the batch through json_each) stored. The
# value is JSON text formatted here (_value_text): any valid JSON object reads
# back the same. An existing row is updated in place (ON CONFLICT DO UPDATE),
# not deleted and inserted again as REPLACE does (which also rewrites the key
# index). CPU for a flush of 10,000 rows: 115 ms with
# per-row dicts, json.dumps and json_each; 65 ms formatted and bound with
# REPLACE; 40 ms with the in-place update. sqlitedict's own update() is a
# queue round trip per row.
def _upsert(rows: int) -> str:
    return (
        f'INSERT INTO "{_TABLE}" (key, value) VALUES '
        + ",".join(["(json(?), ?)"] * rows)
        + " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
    )


_DELETE = f'DELETE FROM "{_TABLE}" WHERE key IN (SELECT json(value) FROM json_each(?))'
# Loading: the values of CHUNK_LOAD rows joined into one JSON array by plain
# string concatenation (every value is a whole record, its key included),
# validated in one call. json_group_array(json(value)) made SQLite parse and
# re-render every value first: 20 against 7 ms per 10,000 rows. The row count
# and the count of values that are JSON alone come along: a chunk is used only
# if every value is (NULL, text that would read as two records, or two halves
# that join into records fail it), and the row-by-row path skips the bad ones.
# Values come back as bytes (CAST AS BLOB): text that is not UTF-8 is then a
# validation error of that row, not a decoding error of the whole query.
_LOAD_CHUNK = (
    "SELECT CAST('[' || group_concat(value, ',') || ']' AS BLOB), max(rowid), count(*),"
    " sum(json_valid(value)) FROM "
    f'(SELECT rowid, value FROM "{_TABLE}" WHERE rowid > ? ORDER BY rowid LIMIT ?)'
)
_LOAD_ROWS = f'SELECT CAST(value AS BLOB) FROM "{_TABLE}" ORDER BY rowid'
# Primary SQLite result codes that mean "cannot write here now", not "bad file".
_UNWRITABLE = {
    sqlite3.SQLITE_PERM,
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_CANTOPEN,
}


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


class StoredRow(TypedDict):
    """:class:`StoredDevice` as a typed dict: the same fields and rules, validated

    2.5 times faster in bulk (no model instance per row; 20 against 51 ms per
    10,000 rows), for :meth:`HealthStore.load`. A unit test keeps the two alike.
    """

    v: int
    driver: str
    pool: str
    device: str
    health: models.HealthStatus
    message: NotRequired[Annotated[str, pydantic.Field(max_length=4096)]]
    lease: Annotated[float, pydantic.Field(gt=0)]
    last_report: float
    driver_time: NotRequired[int]
    endpoint: NotRequired[str]


_ROWS = pydantic.TypeAdapter(list[StoredRow])


def _record_of(row: StoredRow) -> tuple[models.DeviceKey, models.DeviceHealth]:
    new = tuple.__new__  # a named tuple's own __new__ is a Python-level call
    key = new(models.DeviceKey, (row["driver"], row["pool"], row["device"]))
    record = new(
        models.DeviceHealth,
        (
            row["health"],
            row.get("message", ""),
            row["lease"],
            row["last_report"],
            row.get("driver_time", 0),
            row.get("endpoint", ""),
        ),
    )
    return key, record


def _value(key: healthinfo.StagedKey, record: models.DeviceHealth) -> dict[str, Any]:
    driver, pool, device = key
    return {
        "v": SCHEMA_VERSION,
        "driver": driver,
        "pool": pool,
        "device": device,
        "health": record.health.value,
        "message": record.message,
        "lease": record.lease,
        "last_report": record.last_report,
        "driver_time": record.driver_time,
        "endpoint": record.endpoint,
    }


# json's own string encoder (C; ensure_ascii=False): quotes and escapes.
_encode: Callable[[str], str] = json.encoder.encode_basestring
_HEALTH_TEXT = {health: _encode(health.value) for health in models.HealthStatus}


def _value_text(key: healthinfo.StagedKey, record: models.DeviceHealth) -> tuple[str, str]:
    """The key's and the value's JSON text, as ``json.dumps`` of :func:`_value` would give.

    Formatted directly: a dict and a ``json.dumps`` per row cost three times
    as much, and a flush of 10,000 rows holds the GIL for all of it.
    """
    driver, pool, device = key
    driver, pool, device = _encode(driver), _encode(pool), _encode(device)
    lease, last_report = repr(record.lease), repr(record.last_report)
    health = _HEALTH_TEXT.get(record.health)  # not .value: an enum property, a third of this
    if health is None or "n" in lease or "n" in last_report or type(record.driver_time) is not int:
        # nan/inf (json spells them differently) or an odd type: the slow, exact way.
        return (
            f"[{driver},{pool},{device}]",
            json.dumps(_value(key, record), ensure_ascii=False),
        )
    return (
        f"[{driver},{pool},{device}]",
        f'{{"v":{SCHEMA_VERSION},"driver":{driver},"pool":{pool},"device":{device},'
        f'"health":{health},"message":{_encode(record.message)},'
        f'"lease":{lease},"last_report":{last_report},"driver_time":{record.driver_time},'
        f'"endpoint":{_encode(record.endpoint)}}}',
    )


def _parameters(
    chunk: list[tuple[healthinfo.StagedKey, models.DeviceHealth]],
) -> list[str]:
    """The flat (key, value, key, value, ...) parameters of one :func:`_upsert` statement."""
    out: list[str] = []
    extend = out.extend
    for key, record in chunk:
        extend(_value_text(key, record))
    return out


class Connection:
    """The store's one writer connection: every statement the store sends goes through here.

    sqlitedict does part of the job, and this is the part: it owns the connection and the
    worker thread that runs every write, so a flush from the flush loop's thread and a close
    from the shutdown path queue on one thread instead of sharing an ``sqlite3`` object; and
    it fixes the table shape (a file stays readable as a ``SqliteDict``). The rest is SQL of
    ours, sent through its guarded ``execute``/``select_one`` path: its ``update`` is one
    queue round trip per row (a chunked upsert replaces it), and its ``commit`` runs
    unguarded in the worker, where a full disk kills the thread and every later call waits
    forever (``COMMIT`` and ``ROLLBACK`` as statements bring the error back to the caller).
    Reads use plain ``sqlite3`` connections of their own (:meth:`HealthStore.load`).

    The fault seam of the tests: :meth:`fail` makes the next statement that starts with a
    given word raise a given error, once, without touching SQLite (a failing ``COMMIT``
    after the upserts ran, which a read-only disk never gives).
    """

    def __init__(self, db: sqlitedict.SqliteDict) -> None:
        self._db = db
        self._faults: list[tuple[str, BaseException]] = []

    def execute(self, sql: str, parameters: tuple[Any, ...] | list[Any] = ()) -> None:
        self._fault(sql)
        self._db.conn.execute(sql, parameters)

    def query(self, sql: str, parameters: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
        """The first row of ``sql`` (``None`` if it has none), after every queued write."""
        self._fault(sql)
        row: tuple[Any, ...] | None = self._db.conn.select_one(sql, parameters or None)
        return row

    def commit(self) -> None:
        self.query("COMMIT")

    def rollback(self) -> None:
        self.query("ROLLBACK")

    @property
    def alive(self) -> bool:
        conn = self._db.conn
        return conn is not None and bool(conn.is_alive())

    def close(self) -> None:
        if self.alive:
            self._db.close()

    def fail(self, statement: str, error: BaseException) -> None:
        """Make the next statement starting with ``statement`` raise ``error`` (tests)."""
        self._faults.append((statement.upper(), error))

    def _fault(self, sql: str) -> None:
        head = sql.lstrip().upper()
        for i, (statement, error) in enumerate(self._faults):
            if head.startswith(statement):
                del self._faults[i]
                raise error


class HealthStore:
    """The on-disk health cache. Thread-safe; blocking calls (use a thread).

    - one SQLite file, opened through sqlitedict, in WAL mode with
      ``synchronous=FULL`` (:data:`SYNCHRONOUS`): a committed batch survives a
      crash of the process (SIGKILL) and a power loss, and the file is never
      torn. NORMAL syncs the WAL only before a checkpoint, so a power loss lost
      every commit since the last one, up to a whole WAL (about 1,000 commits;
      ``tests/powerloss``), which broke the half-lease guarantee below.
      sqlitedict hard-codes ``synchronous=OFF`` (not safe against power loss),
      so we set the level ourselves after opening;
    - values are versioned JSON (``StoredDevice``), never pickles;
    - writes are staged in memory (the latest record per device wins) and
      committed in one transaction by :meth:`HealthStore.flush`, so a flood of
      reports costs one commit per flush, not per device. The batch is sent to
      SQLite as multi-row ``INSERT ... VALUES ... ON CONFLICT DO UPDATE`` statements
      of :data:`CHUNK` rows
      with bound parameters, each value's JSON text formatted directly (see
      :func:`_value_text`), instead of sqlitedict's one-queue-round-trip-per-row
      ``update``;
    - deletions are staged like records (the latest change per device wins), so
      a device the cache dropped (its driver stopped reporting it, or its stream
      ended) is gone from the file after the next flush and reads ``Unknown``
      after a restart, as the kubelet's deleted entries do;
    - lease renewals are stored too (the kubelet stores only changes), but only
      when the stored record would otherwise expire within half its lease (the
      cache decides, ``healthinfo.PERSIST_FRACTION``), so after a restart a device
      keeps at least half of its lease, counted from its driver's last report
      committed before the crash;
    - a file that cannot be read (garbage, truncation, a schema we do not know)
      is moved aside with a clear error and the cache starts empty: the process
      never crash-loops on its own state;
    - a failing flush (read-only or full disk, file deleted) keeps the staged
      records in memory, reports ``degraded`` and succeeds again when it can. A
      state directory that cannot be written at start (read-only, full) is not
      "corrupt": the file is kept, read if possible, and opened for writing at a
      later flush. SQLite keeps writing to a deleted file without an error, so
      :meth:`HealthStore.replaced` compares the path's inode with the open file's
      and :meth:`HealthStore.reopen` starts a new file with every record.
    """

    def __init__(self, path: pathlib.Path, *, db: Connection | None) -> None:
        self.path = path
        self._db = db  # None: not open for writing yet (see _unopened)
        self._identity = _file_identity(path) if db is not None else None
        self._lock = threading.Lock()
        # Held from taking a batch to its commit: two overlapping flushes (the
        # flush loop's thread and close(), say) must not commit an older batch
        # after a newer one, which would overwrite newer records.
        self._flush_lock = threading.Lock()
        # None marks a staged deletion.
        self._pending: dict[healthinfo.StagedKey, models.DeviceHealth | None] = {}
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
        path = directory / FILE_NAME
        try:
            _make_private_dir(directory)
            return cls(path, db=_open_db(path))
        except (OSError, sqlite3.DatabaseError, errors.StoreError) as exc:
            if _unwritable(exc):
                return cls._unopened(path, exc)
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

    @classmethod
    def _unopened(cls, path: pathlib.Path, exc: BaseException) -> HealthStore:
        # A read-only or full disk is no reason to throw the file away or to
        # crash-loop: serve from memory, and open it at the first flush that can.
        store = cls(path, db=None)
        store.last_error = f"cannot open {path} for writing: {exc}"
        logger.error("health cache %s cannot be written (%s); serving from memory", path, exc)
        return store

    # -- reading -----------------------------------------------------------

    def load(self) -> list[tuple[models.DeviceKey, models.DeviceHealth]]:
        """Every stored record. Rows that do not validate are skipped and counted.

        Read on a connection of its own, not sqlitedict's: sqlitedict's worker
        thread dies on an error while it fetches rows (a value that is not
        UTF-8, a page found corrupt mid-scan), and its caller then waits forever.
        """
        if self._db is None:
            return self._load_read_only()
        try:
            conn = sqlite3.connect(self.path.absolute().as_uri() + "?mode=ro", uri=True)
        except sqlite3.Error as exc:
            logger.error("health cache %s cannot be read (%s); starting empty", self.path, exc)
            return []
        try:
            try:
                with gc_paused():
                    return list(self._load_chunks(conn))
            except (sqlite3.Error, pydantic.ValidationError, ValueError):
                # One bad row spoils the fast path; read row by row and skip it.
                return self._load_rows(conn)
        finally:
            conn.close()

    def _load_chunks(
        self, conn: sqlite3.Connection
    ) -> Iterator[tuple[models.DeviceKey, models.DeviceHealth]]:
        # CHUNK rows per query, validated in one pass each: fast, and the
        # transient JSON and models of a 100,000-device file never exist at once.
        after = 0
        while True:
            row = conn.execute(_LOAD_CHUNK, (after, CHUNK_LOAD)).fetchone()
            if not row or row[1] is None:
                return
            if row[3] != row[2]:
                raise ValueError("a stored value is not JSON")
            stored = _ROWS.validate_json(row[0] or b"")
            if len(stored) != row[2]:
                raise ValueError("a stored value is not one JSON object")
            yield from map(_record_of, stored)
            after = row[1]

    def _load_read_only(self) -> list[tuple[models.DeviceKey, models.DeviceHealth]]:
        # On a read-only filesystem a WAL file cannot be opened even read-only
        # (no -shm can be created); immutable=1 reads it as is, without the WAL.
        uri = self.path.absolute().as_uri()
        failure: sqlite3.Error | None = None
        for query in ("?mode=ro", "?immutable=1"):
            try:
                conn = sqlite3.connect(uri + query, uri=True)
                try:
                    return self._load_rows(conn, strict=True)
                finally:
                    conn.close()
            except sqlite3.Error as exc:
                failure = exc
                continue
        logger.warning(
            "health cache %s not readable either (%s); starting empty", self.path, failure
        )
        return []

    def _load_rows(
        self, conn: sqlite3.Connection, *, strict: bool = False
    ) -> list[tuple[models.DeviceKey, models.DeviceHealth]]:
        """Row by row, skipping what does not validate; a read error ends the scan
        (and is raised when ``strict``: the caller has another way to read)."""
        out: list[tuple[models.DeviceKey, models.DeviceHealth]] = []
        cursor = conn.execute(_LOAD_ROWS)
        while True:
            try:
                row = cursor.fetchone()
            except sqlite3.Error as exc:
                if strict:
                    raise
                logger.error(
                    "health cache %s: reading stopped after %d records (%s); keeping those",
                    self.path,
                    len(out),
                    exc,
                )
                return out
            if row is None:
                return out
            try:
                out.append(StoredDevice.model_validate_json(row[0] or b"").to_record())
            except (pydantic.ValidationError, ValueError, TypeError) as exc:
                self.skipped_rows += 1
                logger.warning("skipping unreadable health record: %s", exc)

    # -- writing -----------------------------------------------------------

    def stage(self, key: models.DeviceKey, record: models.DeviceHealth) -> None:
        """Queue a record for the next flush; the latest per device wins."""
        with self._lock:
            self._pending[key] = record

    def stage_many(
        self, records: Iterable[tuple[healthinfo.StagedKey, models.DeviceHealth]]
    ) -> None:
        """Queue many records under one lock (one report's worth).

        A key may be a plain (driver, pool, device) tuple: it is equal to,
        and hashes as, the :class:`models.DeviceKey` of the same device.
        """
        with self._lock:
            self._pending.update(records)

    def stage_delete(self, keys: Iterable[models.DeviceKey]) -> None:
        """Queue deletions for the next flush (a later stage of the device wins)."""
        with self._lock:
            self._pending.update(dict.fromkeys(keys))

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
        with self._flush_lock:
            return self._flush()

    def _flush(self) -> int:
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return 0
        items = [(k, r) for k, r in batch.items() if r is not None]
        gone = [list(k) for k, r in batch.items() if r is None]
        try:
            db = self._db if self._db is not None else self._connect()
            # Statements of CHUNK rows, one transaction: a 100k-device flush
            # must not hold a 30 MB argument and its parse tree at once.
            for start in range(0, len(items), CHUNK):
                chunk = items[start : start + CHUNK]
                db.execute(_upsert(len(chunk)), _parameters(chunk))
            for start in range(0, len(gone), CHUNK):
                payload = json.dumps(gone[start : start + CHUNK], ensure_ascii=False)
                db.execute(_DELETE, (payload,))
            db.commit()
        except Exception as exc:  # sqlite3 errors arrive re-raised from sqlitedict's thread
            self._restage(batch)
            self.last_error = str(exc)
            raise errors.StoreError(f"cannot write health cache {self.path}: {exc}") from exc
        self.commits += 1
        self.last_error = None
        return len(batch)

    def _restage(self, batch: dict[healthinfo.StagedKey, models.DeviceHealth | None]) -> None:
        with self._lock:
            batch.update(self._pending)
            self._pending = batch
        self._rollback()

    @property
    def connection(self) -> Connection | None:
        """The writer connection (``None`` until the file could be opened for writing)."""
        return self._db

    def _connect(self) -> Connection:
        _make_private_dir(self.path.parent)
        db = _open_db(self.path)
        self._db, self._identity = db, _file_identity(self.path)
        return db

    def replaced(self) -> bool:
        """True when the open file is no longer the one at :attr:`path`.

        Deleted, renamed or replaced (a new inode): SQLite goes on writing to
        the old inode without any error, so only this check notices.
        """
        if self._db is None:
            return False
        return _file_identity(self.path) != self._identity

    def reopen(self, records: Iterable[tuple[models.DeviceKey, models.DeviceHealth]]) -> None:
        """Let go of a deleted file; the next flush writes ``records`` to a new one.

        ``records`` is the whole cache (the deleted file held what was
        committed); what was staged meanwhile wins over it.
        """
        old, self._db, self._identity = self._db, None, None
        self.last_error = f"health cache file {self.path} was deleted or replaced"
        with self._lock:
            staged: dict[healthinfo.StagedKey, models.DeviceHealth | None] = dict(records)
            staged.update(self._pending)
            self._pending = staged
        if old is not None:
            try:
                old.close()
            except Exception:
                logger.debug("closing the deleted health cache failed", exc_info=True)

    def _rollback(self) -> None:
        if self._db is None:
            return
        try:
            self._db.rollback()
        except Exception:  # nothing to roll back, or the connection is gone
            logger.debug("rollback after failed flush did not apply", exc_info=True)

    def delete(self, keys: list[models.DeviceKey]) -> None:
        """Remove records now (used by ``cache`` maintenance commands)."""
        payload = json.dumps([list(k) for k in keys], ensure_ascii=False)
        db = self._db if self._db is not None else self._connect()
        db.execute(_DELETE, (payload,))
        db.commit()

    def close(self) -> None:
        """Flush what is staged (best effort) and close the file."""
        try:
            self.flush()
        except errors.StoreError as exc:
            logger.error("health cache not flushed at close: %s", exc)
        if self._db is not None:
            self._db.close()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a bulk load of acyclic values.

    A 100,000-device load allocates about half a million dicts and tuples,
    none in a cycle; the collector's full passes over them cost a third of
    the load (800 against 400-460 ms of CPU). Start-up only, and
    only for as long as the load (or the cache's, ``manager``) runs.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _make_private_dir(directory: pathlib.Path) -> None:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise errors.StoreError(f"cannot create state directory {directory}: {exc}") from exc


def _file_identity(path: pathlib.Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _unwritable(exc: BaseException) -> bool:
    """A failure of the disk (read-only, full, permissions), not of the file's contents."""
    cause = exc.__cause__ if isinstance(exc, errors.StoreError) else exc
    if isinstance(cause, OSError):
        return True
    code = getattr(cause, "sqlite_errorcode", None)
    return isinstance(cause, sqlite3.Error) and code is not None and code & 0xFF in _UNWRITABLE


def _open_db(path: pathlib.Path) -> Connection:
    if path.exists():
        _verify(path)
    else:
        # A -wal or -shm left without its database (the file was deleted)
        # would be replayed into the new one.
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path.with_name(path.name + suffix))
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
    connection = Connection(db)
    connection.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
    return connection


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
        _check_shapes(conn)
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


def _check_shapes(conn: sqlite3.Connection) -> None:
    """Our two names, where present, must be tables of (key, value): the integrity check
    passes a file whose column was renamed, and every later read of it would fail."""
    for name in (_TABLE, _META):
        kind = conn.execute("SELECT type FROM sqlite_master WHERE name = ?", (name,)).fetchone()
        if kind is None:
            continue
        columns = [row[1] for row in conn.execute(f'PRAGMA table_info("{name}")')]
        if kind[0] != "table" or columns != ["key", "value"]:
            raise errors.StoreError(
                f"{name!r} is a {kind[0]} of columns {columns}, not a table of key and value"
            )


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

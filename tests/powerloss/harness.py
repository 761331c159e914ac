"""Power-loss harness: the health store's file as a power loss at each flush point leaves it.

A user-space counterpart of device-mapper's ``log-writes`` target, used
because this kernel has no device-mapper (docs/reliability.md "Power loss").
``writelog.c`` (LD_PRELOAD) logs every write, truncate, create, unlink and
sync the store's process makes in its state directory; :func:`crash_points`
replays the log and yields, for every point where what is durable changes,
the files a disk that drops every write not yet flushed would hold:

- ``dropped`` (the power-loss model): each file as of its own last
  ``fsync``/``fdatasync``; a file exists once it or its directory was synced
  (ext4's behaviour; POSIX asks for the directory); an unlink counts at once;
- ``written`` (log-writes replayed up to the point, or a SIGKILL): every
  write made so far.

Each image is opened with :meth:`kubelet_dra.state.store.HealthStore.open` as a
restart would, and compared with the commits that had returned by then: the
next sync is the latest the crash can come, so every commit marked before it
had returned. The ``-shm`` file is left out (SQLite rebuilds it from the WAL
when the first connection opens; its writes go through a memory map).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator

from kubelet_dra.state import store
from tests.powerloss import workload

SHIM_SOURCE = pathlib.Path(__file__).with_name("writelog.c")
ROOT = SHIM_SOURCE.parents[2]
_HEAD = struct.Struct("=cI")
_TAIL = struct.Struct("=QQ")
DURABLE_CHANGES = {b"S", b"D", b"U"}


@dataclasses.dataclass(frozen=True)
class Op:
    kind: bytes
    name: str  # the file's name in the state directory ("" for the directory itself)
    offset: int
    data: bytes


@dataclasses.dataclass(frozen=True)
class CrashPoint:
    index: int  # ops before it took effect
    files: dict[str, bytes]
    returned: int  # commits that had returned (batches 0 .. returned-1)
    wal_bytes_unsynced: int  # -wal bytes written since its last sync (dropped model)


@dataclasses.dataclass(frozen=True)
class Outcome:
    point: CrashPoint
    recovered: int  # batches in the recovered file (the last batch found + 1; 0 if none)
    moved_aside: bool
    mixed: bool  # records of different batches: a commit half applied

    @property
    def lost(self) -> int:
        return self.point.returned - self.recovered


def build_shim(cache: pathlib.Path) -> pathlib.Path:
    """Compile ``writelog.c`` into ``cache`` (once per source version)."""
    digest = hashlib.sha256(SHIM_SOURCE.read_bytes()).hexdigest()[:12]
    out = cache / f"writelog-{digest}.so"
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run(
            ["gcc", "-O2", "-Wall", "-shared", "-fPIC", "-o", str(tmp), str(SHIM_SOURCE), "-ldl"],
            check=True,
        )
        os.replace(tmp, out)
    return out


def record_run(
    shim: pathlib.Path, work: pathlib.Path, synchronous: str, commits: int, devices: int
) -> list[Op]:
    """Run the workload under the shim in a fresh ``work/state``; return its log."""
    state = work / "state"
    log = work / "writes.log"
    shutil.rmtree(state, ignore_errors=True)
    log.unlink(missing_ok=True)
    state.mkdir(mode=0o700, parents=True)
    env = {
        **os.environ,
        "LD_PRELOAD": str(shim),
        "POWERLOSS_DIR": str(state),
        "POWERLOSS_LOG": str(log),
        "PYTHONPATH": str(ROOT),
    }
    args = [str(state), str(commits), str(devices), synchronous]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.powerloss.workload", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"workload failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return parse(log.read_bytes(), state.resolve())


def parse(raw: bytes, state: pathlib.Path) -> list[Op]:
    ops: list[Op] = []
    at = 0
    prefix = str(state)
    while at < len(raw):
        kind, plen = _HEAD.unpack_from(raw, at)
        at += _HEAD.size
        path = raw[at : at + plen].decode()
        at += plen
        offset, length = _TAIL.unpack_from(raw, at)
        at += _TAIL.size
        data = raw[at : at + length]
        at += length
        name = path[len(prefix) :].lstrip("/")
        if name.endswith("-shm") or (name == workload.MARK and kind != b"M"):
            continue
        ops.append(Op(kind, name, offset, data))
    return ops


def _write(buf: bytearray, offset: int, data: bytes) -> None:
    if len(buf) < offset:
        buf.extend(bytes(offset - len(buf)))
    buf[offset : offset + len(data)] = data


def crash_points(ops: list[Op], model: str) -> Iterator[CrashPoint]:
    """Every distinct image the ``dropped`` or ``written`` model can leave, in order."""
    current: dict[str, bytearray] = {}
    durable: dict[str, bytes] = {}
    marks = 0
    wal_unsynced = 0
    stops = [i for i, op in enumerate(ops) if op.kind in DURABLE_CHANGES]
    if model == "written":
        stops = [i for i, op in enumerate(ops) if op.kind == b"M" or op.kind in DURABLE_CHANGES]
    stops.append(len(ops))
    begin = 0
    for stop in stops:
        for op in ops[begin:stop]:
            marks, wal_unsynced = _apply(op, current, durable, marks, wal_unsynced)
        begin = stop
        files = durable if model == "dropped" else {k: bytes(v) for k, v in current.items()}
        yield CrashPoint(stop, dict(files), marks, wal_unsynced)


def _apply(
    op: Op, current: dict[str, bytearray], durable: dict[str, bytes], marks: int, wal: int
) -> tuple[int, int]:
    if op.kind == b"M":
        return marks + 1, wal
    if op.kind == b"C":
        current[op.name] = bytearray()
    elif op.kind == b"W":
        _write(current.setdefault(op.name, bytearray()), op.offset, op.data)
        if op.name.endswith("-wal"):
            wal += len(op.data)
    elif op.kind == b"T":
        buf = current.setdefault(op.name, bytearray())
        del buf[op.offset :]
        _write(buf, len(buf), bytes(op.offset - len(buf)))
    elif op.kind == b"S":
        durable[op.name] = bytes(current.get(op.name, b""))
        if op.name.endswith("-wal"):
            wal = 0
    elif op.kind == b"D":
        for name in current:
            durable.setdefault(name, b"")
    elif op.kind == b"U":
        current.pop(op.name, None)
        durable.pop(op.name, None)
    return marks, wal


def recover(point: CrashPoint, scratch: pathlib.Path) -> Outcome:
    """Open the image as a restarted sidecar would and find which batch it holds."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(mode=0o700, parents=True)
    for name, data in point.files.items():
        if name and name != workload.MARK:
            (scratch / name).write_bytes(data)
    db = store.HealthStore.open(scratch)
    try:
        batches = {int(r.message) for _, r in db.load()}
        aside = db.moved_aside is not None
    finally:
        db.close()
    recovered = max(batches) + 1 if batches else 0
    return Outcome(point, recovered, aside, len(batches) > 1)


def run(
    work: pathlib.Path,
    synchronous: str,
    commits: int,
    devices: int,
    model: str = "dropped",
    shim_dir: pathlib.Path | None = None,
) -> list[Outcome]:
    """Record a run and open the image at every crash point of ``model``."""
    shim = build_shim(shim_dir or work / "shim")
    ops = record_run(shim, work, synchronous, commits, devices)
    marks = sum(op.kind == b"M" for op in ops)
    if marks != commits:
        raise RuntimeError(f"the log holds {marks} marks for {commits} commits")
    return [recover(p, work / "replay") for p in crash_points(ops, model)]

"""The writer a power loss interrupts: commits of the health store, each marked once it returned.

Run in a child process with ``writelog.so`` preloaded (see ``harness.py``):
``python -m tests.powerloss.workload STATE_DIR COMMITS DEVICES SYNCHRONOUS``. Every
batch rewrites every device's record with the batch number as its message and
its receive time, as the sidecar's flush loop commits what the cache staged
(``store.HealthStore.flush``). After each flush returns, the batch number is
written to ``powerloss.mark``, which the shim logs in order with the writes
and never writes anywhere. The process ends with ``os._exit``: a power loss
meets a running process, not one that closed (and checkpointed) its file.
"""

from __future__ import annotations

import os
import pathlib
import sys

from kubelet_dra import models
from kubelet_dra.state import store

T0 = 1_000_000.0
LEASE = 30.0
DRIVER = "gpu.example.com"
MARK = "powerloss.mark"


def record(batch: int) -> models.DeviceHealth:
    """Batch ``batch``'s record of every device (its message is the batch number)."""
    return models.DeviceHealth(
        health=models.HealthStatus.HEALTHY,
        message=str(batch),
        lease=LEASE,
        last_report=T0 + batch,
        endpoint="/var/lib/kubelet/plugins/gpu/dra.sock",
    )


def run(state_dir: pathlib.Path, commits: int, devices: int) -> None:
    db = store.HealthStore.open(state_dir)
    assert db.connection is not None, db.last_error
    level = db.connection.query("PRAGMA synchronous")
    mmap = db.connection.query("PRAGMA mmap_size")
    assert level is not None
    # Writes through a memory map would escape the shim.
    assert mmap == (0,), mmap
    sys.stdout.write(f"synchronous={level[0]}\n")
    mark = os.open(state_dir / MARK, os.O_WRONLY | os.O_CREAT, 0o600)
    for batch in range(commits):
        db.stage_many(((DRIVER, "pool", f"dev{i}"), record(batch)) for i in range(devices))
        db.flush()
        os.write(mark, f"{batch}\n".encode())
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    directory, count, width, level = sys.argv[1:5]
    store.SYNCHRONOUS = level
    run(pathlib.Path(directory), int(count), int(width))

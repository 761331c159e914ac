"""Crash safety: SIGKILL a writer at random points; every reopen is a committed prefix.

A child process replays a deterministic sequence of batches into the store
(batch ``k`` writes a window of devices with ``driver_time = k`` and message
``k``: a change, persisted at once, where a bare renewal would wait for half
its lease) and prints
``k`` after each commit. The parent kills it at random moments. After each
kill the store must open, and its contents must equal the state after some
batch ``k`` with ``acknowledged <= k <= acknowledged + 1`` (the one in flight
may or may not have committed, nothing else).
"""

from __future__ import annotations

import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest

from kubelet_dra.state import store

ROUNDS = int(os.environ.get("KUBELET_DRA_CRASH_ROUNDS", "50"))
DEVICES = 200
WINDOW = 60

CHILD = r"""
import sys
from kubelet_dra.state import healthinfo, store
from kubelet_dra import models

HEALTHY = models.HealthStatus.HEALTHY
state, start = sys.argv[1], int(sys.argv[2])
db = store.HealthStore.open(state)
cache = healthinfo.HealthCache(sink=db)
print("ready", flush=True)
k = start
while True:
    first = (k * 37) % 200
    reports = [
        models.DeviceReport("pool", f"dev{(first + i) % 200}", HEALTHY, str(k), 0, k)
        for i in range(60)
    ]
    cache.update("drv", reports, now=1_000_000.0 + k, endpoint="e")
    db.flush()
    print(k, flush=True)
    k += 1
"""


def expected_after(batch: int) -> dict[str, int]:
    state: dict[str, int] = {}
    for k in range(batch + 1):
        first = (k * 37) % DEVICES
        for i in range(WINDOW):
            state[f"dev{(first + i) % DEVICES}"] = k
    return state


def read_state(state_dir: pathlib.Path) -> dict[str, int]:
    db = store.HealthStore.open(state_dir)
    try:
        assert db.moved_aside is None, "a crash must never corrupt the file"
        return {key.device: record.driver_time for key, record in db.load()}
    finally:
        db.close()


def last_batch(state: dict[str, int]) -> int:
    return max(state.values(), default=-1)


def run_round(state_dir: pathlib.Path, start: int, rng: random.Random) -> int:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(state_dir), str(start)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.15))  # a random point in the write loop, not a timing check
    finally:
        # Killed here in every case: a child left running (the test failed or timed out
        # while it started) would fail whichever test runs next with a ResourceWarning.
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate()
    acked = [int(line) for line in out.split()]
    return acked[-1] if acked else start - 1


# 50 child interpreters: each starts in well under a second, but eight test runs sharing
# two cores have taken more than the default 60 s for all of them.
@pytest.mark.timeout(300)
def test_sigkill_at_random_points_leaves_a_committed_prefix(tmp_path: pathlib.Path) -> None:
    rng = random.Random(4680)
    state_dir = tmp_path / "state"
    state: dict[str, int] = {}
    kills_mid_run = 0
    for _ in range(ROUNDS):
        start = last_batch(state) + 1
        acked = run_round(state_dir, start, rng)
        state = read_state(state_dir)
        batch = last_batch(state)
        assert acked <= batch <= acked + 1, (acked, batch)
        assert state == (expected_after(batch) if batch >= 0 else {})
        kills_mid_run += batch > acked
    print(
        f"\nSIGKILL rounds: {ROUNDS}, last batch {last_batch(state)}, "
        f"in-flight batch committed in {kills_mid_run} rounds"
    )
    assert last_batch(state) > 0, "the writer never committed anything"

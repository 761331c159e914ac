"""Power loss: the health store loses no returned commit (short version of ``tox -e powerloss``).

The store's process runs under the write-logging shim (``writelog.c``, no root
needed); its log is replayed to every flush point as a disk that drops
unflushed writes would leave it (``harness.py``). At every point the file must
open without being moved aside, hold whole commits only, and hold every
commit that had returned. A second test runs ``synchronous=NORMAL`` to show
that the replay does see losses: there, every commit since the WAL was last
synced is gone.
"""

from __future__ import annotations

import pathlib
import shutil

import pytest

from kubelet_dra.state import store
from tests.powerloss import harness

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc for the shim")

COMMITS = 40
DEVICES = 8


@pytest.fixture(scope="module")
def shim_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("shim")


def test_no_returned_commit_is_lost_at_any_flush_point(
    tmp_path: pathlib.Path, shim_dir: pathlib.Path
) -> None:
    outcomes = harness.run(tmp_path, store.SYNCHRONOUS, COMMITS, DEVICES, shim_dir=shim_dir)
    for o in outcomes:
        assert not o.moved_aside, o.point
        assert not o.mixed, o.point
        # The commit in flight may be in the file already (synced, not yet returned).
        seen = f"after op {o.point.index}: {o.point.returned} returned, {o.recovered} in the file"
        assert o.point.returned <= o.recovered <= o.point.returned + 1, seen
    assert outcomes[-1].point.returned == outcomes[-1].recovered == COMMITS
    # One sync per commit at least: every commit was a crash point.
    assert len(outcomes) > COMMITS


def test_the_replay_sees_what_synchronous_normal_loses(
    tmp_path: pathlib.Path, shim_dir: pathlib.Path
) -> None:
    outcomes = harness.run(tmp_path, "NORMAL", COMMITS, DEVICES, shim_dir=shim_dir)
    # Fewer commits than a WAL checkpoint takes: the WAL is never synced, and a
    # power loss at the end finds the empty file the schema left.
    last = outcomes[-1]
    assert last.point.returned == COMMITS
    assert last.recovered == 0
    assert not any(o.moved_aside or o.mixed for o in outcomes)

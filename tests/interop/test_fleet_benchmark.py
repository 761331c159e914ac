"""The ``fleet`` benchmark end to end at its smallest size: 4 nodes of our library against the
real kube-apiserver and etcd, every phase (start, flap, rack failure, apiserver restarts, the
rack failure under API Priority and Fairness) ending with every affected pod showing its
change, and the kubelet's way measured for the same pods.

Figures are not checked (no timing assertions); correctness and the report's shape are. One
run serves both tests (it takes minutes).
"""

from __future__ import annotations

import asyncio

import pytest

from benchmarks import _common as c
from benchmarks import fleet

pytestmark = [pytest.mark.interop, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def outcome() -> c.Outcome:
    found = asyncio.run(fleet.run(fleet.SMOKE))
    skipped = [n for n in found.notes if n.startswith("SKIPPED")]
    if skipped:
        pytest.skip(f"interop: {skipped[0]}")
    return found


def test_fleet_smoke_loses_no_change_and_reports_against_the_kubelets_way(
    outcome: c.Outcome,
) -> None:
    assert outcome.failures == []
    rack = next(r for r in outcome.summary if "rack failure," in r.scenario)
    assert rack.value is not None and rack.value > 0
    restart = next(r for r in outcome.summary if "apiserver restart" in r.scenario)
    assert restart.met is True  # every pod showed the change made while it was down
    assert len(outcome.tables) == 6


def test_fleet_converges_under_429s_with_priority_and_fairness_on(outcome: c.Outcome) -> None:
    """All 4 nodes fail at once against a priority level of 3 seats and a queue of 1: the
    apiserver answers 429 with Retry-After, the writers wait and retry, and every pod of
    every node still shows every device's new health (a phase with a pod that never did
    fails the run: ``outcome.failures``)."""
    assert outcome.failures == []
    apf = next(r for r in outcome.summary if "under APF" in r.scenario)
    rejected, retries = (int(x.split()[0]) for x in apf.figure.split(", ")[:2])
    assert rejected > 0  # the 429 path was taken ...
    assert retries > 0  # ... and the writers retried ...
    assert apf.met is True  # ... and no change was lost
    assert apf.ratio == "0 pods not current"

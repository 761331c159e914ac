"""The ``fleet`` benchmark end to end at its smallest size: 4 nodes of our library against the
real kube-apiserver and etcd, every phase (start, flap, rack failure, apiserver restart) ending
with every affected pod showing its change, and the kubelet's way measured for the same pods.

Figures are not checked (no timing assertions); correctness and the report's shape are.
"""

from __future__ import annotations

import pytest

from benchmarks import fleet

pytestmark = [pytest.mark.interop, pytest.mark.timeout(600)]


async def test_fleet_smoke_loses_no_change_and_reports_against_the_kubelets_way() -> None:
    outcome = await fleet.run(fleet.SMOKE)
    skipped = [n for n in outcome.notes if n.startswith("SKIPPED")]
    if skipped:
        pytest.skip(f"interop: {skipped[0]}")
    assert outcome.failures == []
    rack = next(r for r in outcome.summary if "rack failure" in r.scenario)
    assert rack.value is not None and rack.value > 0
    restart = next(r for r in outcome.summary if "apiserver restart" in r.scenario)
    assert restart.met is True  # every pod showed the change made while it was down
    assert len(outcome.tables) == 4

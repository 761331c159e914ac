"""The benchmarks still run and still check their end states (smallest sizes, no timing checks).

Runs the ingest, latency, persistence, restart and kubectl scenarios of ``benchmarks`` at their
``SMOKE`` sizes: a real benchmark driver process, the in-process pipeline and
store, and a real sidecar process against the API stand-in. A scenario that
ends in a wrong state reports a failure; figures are not looked at.
"""

from __future__ import annotations

import importlib

import pytest

from benchmarks import _common

SCENARIOS = ["ingest", "latency", "persistence", "restart", "kubectl"]


@pytest.mark.parametrize("name", SCENARIOS, ids=str)
async def test_benchmark_scenario_runs_and_ends_in_the_exact_state(name: str) -> None:
    module = importlib.import_module(f"benchmarks.{name}")
    outcome: _common.Outcome = await module.run(module.SMOKE)
    assert outcome.failures == []
    assert outcome.summary, "every scenario reports at least one summary row"
    assert outcome.tables

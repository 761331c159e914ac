"""How the runner treats timing it could not keep (no Go needed).

A twin that does not answer within its timeout is a timing failure, not a difference the
kubelet computed; and a run whose timing failed among concurrent runs is run again on its
own, while a run that showed a difference is never run again.
"""

from __future__ import annotations

import logging
import sys

import pytest

from tests.conformance import _compare, _runner, _twinlike
from tests.conformance import _scenario as sc


def _scenario(name: str) -> sc.Scenario:
    return sc.Scenario.model_validate(
        {"name": name, "description": name, "drivers": [{"name": "d"}], "timeline": [{"sync": "s"}]}
    )


async def test_a_twin_that_does_not_answer_in_time_is_a_timing_failure() -> None:
    silent = _twinlike.ProcessTwin(
        sys.executable, args=["-c", "import sys; sys.stdin.read()"], timeout=0.3
    )
    try:
        with pytest.raises(_twinlike.TwinTimeout, match=r"no answer within 0\.3s"):
            await silent.call("start")
    finally:
        await silent.kill()


async def test_only_runs_whose_timing_failed_are_run_again_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    verdict = _compare.classify(_scenario("x"), "1.38", [])
    differs = _compare.Observed("status", "s", "pod/c", "a", "b")

    async def fake_run_one(
        scenario: sc.Scenario, line: str, factory: _runner.TwinFactory, **_: object
    ) -> _runner.RunResult:
        calls.append(scenario.name)
        first = calls.count(scenario.name) == 1
        timing = scenario.name == "slow" and first
        observed = [differs] if scenario.name == "differs" else []
        result_verdict = _compare.classify(scenario, line, observed) if observed else verdict
        return _runner.RunResult(
            scenario.name, line, "", 0.0, observed, result_verdict,
            "timing could not be kept" if timing else "", timing=timing,
        )  # fmt: skip

    monkeypatch.setattr(_runner, "run_one", fake_run_one)
    chosen = [_scenario(n) for n in ("fine", "slow", "differs")]
    results = await _runner.run_all(chosen, "1.38", _unused_factory)
    assert calls == ["fine", "slow", "differs", "slow"]
    assert [(r.scenario, r.ok, r.alone) for r in results] == [
        ("fine", True, False),
        ("slow", True, True),
        ("differs", False, False),
    ]
    assert "re-run alone" in results[1].report()
    assert logging.getLogger("kubelet_dra").level == logging.NOTSET  # restored for later tests


async def _unused_factory(line: str) -> _twinlike.TwinLike:
    raise AssertionError("run_one is replaced")

"""How the runner treats timing it could not keep (no Go needed).

A twin that does not answer within its timeout is a timing failure, not a difference the
kubelet computed; and a run whose timing failed among concurrent runs is run again on its
own, while a run that showed a difference is never run again. What an attempt compared
before its timing failed is kept: an undeclared difference there fails the run.
"""

from __future__ import annotations

import logging
import sys
import time
import types

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


async def test_differences_of_an_attempt_that_failed_on_timing_fail_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    differs = _compare.Observed("announced", "sync s", "pod p", True, False, "announced")
    attempts: list[int] = []

    class FakeRun:
        def __init__(self, scenario: sc.Scenario, line: str, *_: object) -> None:
            self.scenario, self.line = scenario, line

        async def execute(self) -> _runner.RunResult:
            attempts.append(1)
            if len(attempts) == 1:
                timing = _runner.TimingError("too close to a deadline")
                timing.observed = [differs]
                raise timing
            verdict = _compare.classify(self.scenario, self.line, [])
            return _runner.RunResult(self.scenario.name, self.line, "", 0.0, [], verdict)

    async def factory(line: str) -> _twinlike.TwinLike:
        return object()  # type: ignore[return-value]

    monkeypatch.setattr(_runner, "Run", FakeRun)
    result = await _runner.run_one(_scenario("x"), "1.38", factory)
    assert len(attempts) == 2 and result.attempts == 2
    assert result.verdict.earlier == [differs] and not result.ok
    assert "in an attempt that then failed on timing" in result.report()
    # Declared, the same difference is no failure.
    declared = _scenario("x").model_copy(
        update={
            "differences": (
                sc.Difference(
                    feature="unknown-at-deadline", kinds=("announced",), at=("s",),
                    subject=("pod p",), field=("announced",), ours=True, twin=False,
                ),
            )
        }
    )  # fmt: skip
    attempts.clear()
    result = await _runner.run_one(declared, "1.38", factory)
    assert result.verdict.earlier == [] and result.earlier == [differs]


def test_a_twin_crash_is_named_by_its_panic_line_and_streams_by_version() -> None:
    text = "report: ConnectionResetError panic: assignment to entry in nil map\n\ngoroutine 7 [x]:"
    assert _runner._crash_reason(text) == "panic: assignment to entry in nil map"
    assert _runner._crash_reason("sync failed: boom\nmore") == "sync failed: boom"
    before = {"NodeWatchResources/v1": 1, "GetInfo": 1}
    after = {"NodeWatchResources/v1": 1, "NodeWatchResources/v1alpha1": 1, "GetInfo": 2}
    assert _runner._new_streams(before, after) == ["v1alpha1"]


async def test_a_sync_point_whose_comparisons_outran_a_lease_keeps_only_earlier_ones() -> None:
    # A 16,384-device sync point takes seconds under load; a 30 s lease reported 29.8 s
    # ago (real time) ran within the margin of its deadline while it compared, so what it
    # saw there belongs to the clock. What earlier sync points saw stays.
    earlier = _compare.Observed("announced", "sync a", "pod p", True, False, "announced")
    late = _compare.Observed("devices", "sync b", "d/pool/x", "Healthy", "Unknown", "health")
    run = object.__new__(_runner.Run)
    run.observed = [earlier]
    run.nominal = 0.0
    run.leases = {("d", "pool", "x"): (0.0, time.time() - 29.8, 30.0)}

    async def away() -> None:
        return None

    async def compare(args: sc.Sync) -> None:
        run.observed.append(late)

    run._away_from_deadlines = away  # type: ignore[method-assign]
    run._compare_at = compare  # type: ignore[method-assign]
    run.ours = types.SimpleNamespace(settled=lambda: True)  # type: ignore[assignment]
    run.sidecar = None  # a line the sidecar is not compared on
    with pytest.raises(_runner.TimingError, match=r"within 0\.5s of its 30s lease"):
        await run._do_sync(sc.Sync(name="b"))
    assert run.observed == [earlier]
    # A lease far from its deadline, or one the scenario lets run out, is no timing failure.
    for nominal, real in ((0.0, time.time()), (-31.0, time.time() - 29.8)):
        run.leases = {("d", "pool", "x"): (nominal, real, 30.0)}
        await run._do_sync(sc.Sync(name="b"))
    assert run.observed == [earlier, late, late]

"""The conformance suite: every scenario against the kubelet twin of each line.

One test per line runs all written scenarios concurrently (the kubelet's wall-clock waits
overlap), one the scenarios whose driver is the Go helper driver of the interop tests (with
the session's kube-apiserver), and one runs the generated ones (fixed seeds). A failure
prints every undeclared and every missing difference with a diff. There is no expected
failure: an undeclared difference found by a run is fixed or declared (scoped, with the
values each side shows), never carried as a "known bug" that any difference would satisfy:
a kubelet bug we do better than is a scoped declaration of its scenario
(``unknown-at-deadline`` for kubernetes #140819, ``rolling-upgrade`` for #140818).
"""

from __future__ import annotations

import pytest

from tests.conformance import _generate, _godriver, _matrix, _runner, _sidecar, _suite
from tests.conformance import _scenario as sc
from tests.conformance.conftest import concurrency

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(1800, func_only=True)]

WRITTEN = sc.load_all()


def _check(results: list[_runner.RunResult], scenarios: list[sc.Scenario]) -> None:
    by_name = {s.name: s for s in scenarios}
    failed = [r for r in results if not r.ok]
    print(_suite.masked_summary(results))
    assert not failed, "\n\n".join(r.report() for r in failed)
    for result in results:
        expected = _matrix.cell(by_name[result.scenario], result.line)
        assert result.cell() == expected, f"{result.scenario}: {result.cell()} != {expected}"
        _check_sidecar_compared(result)


def _check_sidecar_compared(result: _runner.RunResult) -> None:
    """On the sidecar's lines a run that compared a status entry compared the sidecar's
    too (the sidecar did not silently sit out); on the others it never ran."""
    status, sidecar = result.by_kind.get("status", 0), result.by_kind.get("sidecar", 0)
    if result.line not in _sidecar.LINES:
        assert not sidecar, f"{result.scenario}: the sidecar ran on {result.line}"
    elif status:
        assert sidecar, f"{result.scenario}: {status} status comparisons, none of the sidecar"


@pytest.mark.parametrize("line", sc.LINES)
async def test_written_scenarios(line: str, twin_binary: str) -> None:
    chosen = [s for s in WRITTEN if line in s.lines and not s.uses_go_helper()]
    results = await _runner.run_all(
        chosen, line, _suite.factory_for(twin_binary), concurrency=concurrency()
    )
    assert len(results) == len(chosen)
    _check(results, chosen)


#: Lines that have a scenario with the Go helper driver (the others have nothing to run).
GO_HELPER_LINES = [line for line in sc.LINES
                   if any(line in s.lines and s.uses_go_helper() for s in WRITTEN)]  # fmt: skip


@pytest.mark.parametrize("line", GO_HELPER_LINES)
async def test_go_helper_scenarios(
    line: str, twin_binary: str, go_helper: _godriver.GoHelperEnv
) -> None:
    chosen = [s for s in WRITTEN if line in s.lines and s.uses_go_helper()]
    results = await _runner.run_all(
        chosen,
        line,
        _suite.factory_for(twin_binary),
        concurrency=concurrency(),
        gohelper=go_helper,
    )
    assert len(results) == len(chosen)
    _check(results, chosen)


@pytest.mark.parametrize("line", _generate.LINES)
async def test_generated_scenarios(line: str, twin_binary: str) -> None:
    scenarios = [_generate.scenario(seed) for seed in _generate.SEEDS]
    results = await _runner.run_all(
        scenarios, line, _suite.factory_for(twin_binary), concurrency=concurrency()
    )
    _check(results, scenarios)


@pytest.mark.slow
@pytest.mark.timeout(7200, func_only=True)
@pytest.mark.parametrize("line", _generate.LINES)
async def test_generated_scenarios_slow(line: str, twin_binary: str) -> None:
    scenarios = [_generate.scenario(seed, slow=True) for seed in _generate.SLOW_SEEDS]
    results = await _runner.run_all(
        scenarios, line, _suite.factory_for(twin_binary), concurrency=concurrency()
    )
    _check(results, scenarios)

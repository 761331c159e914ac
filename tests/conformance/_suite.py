"""The conformance suite: which scenarios, which lines, and the matrix they produce.

``python -m tests.conformance._suite [--line 1.37 ...] [--generated N] [--write-matrix]
[scenario ...]`` runs scenarios against the kubelet twin of each line, prints every
undeclared or missing difference, the wall time per line and how many comparisons each
feature's declarations masked (``--masked-detail``: per declaration), and with
``--write-matrix`` rewrites the matrix section of ``docs/conformance.md``
from the results. The pytest tests (``test_conformance.py``) run the same.

``--scenario-dir DIR --allow-blanket`` runs scenario files of the old, unscoped format
(e.g. an earlier commit's), to measure what their blanket declarations masked.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import pathlib
import sys
import time
from collections.abc import Sequence

from tests.conformance import _compare, _generate, _godriver, _matrix, _runner, _twinlike
from tests.conformance import _scenario as sc

DEFAULT_LINES = ("1.37", "1.38")
"""The lines the default test run covers (the newest two)."""


def version_of(line: str) -> str:
    """The twin's tag for a line, e.g. ``1.37`` -> ``v1.37.2``."""
    from tests.conformance import _twin

    for version in _twin.LINES:
        if version.startswith(f"v{line}."):
            return version
    raise KeyError(f"no twin for kubelet line {line}")


def factory_for(binary: str) -> _runner.TwinFactory:
    async def make(line: str) -> _twinlike.TwinLike:
        return _twinlike.ProcessTwin(binary, args=("-v=2",))

    return make


def written() -> list[sc.Scenario]:
    return sc.load_all()


def generated(seeds: Sequence[int] = _generate.SEEDS) -> list[sc.Scenario]:
    return [_generate.scenario(seed) for seed in seeds]


async def run_line(
    scenarios: Sequence[sc.Scenario],
    line: str,
    binary: str,
    *,
    concurrency: int,
    gohelper: _godriver.GoHelperEnv | None = None,
) -> list[_runner.RunResult]:
    return await _runner.run_all(
        scenarios, line, factory_for(binary), concurrency=concurrency, gohelper=gohelper
    )


def masked_summary(results: Sequence[_runner.RunResult], *, detail: bool = False) -> str:
    """Per feature: its declarations' comparisons (in scope, matched: the sides agreed,
    differed: with the declared values), against every comparison of the runs; with
    ``detail``, the same per declaration."""
    total = sum(r.compared for r in results)
    counts: dict[str, _compare.Count] = collections.defaultdict(_compare.Count)
    declarations: collections.Counter[str] = collections.Counter()
    runs: dict[str, set[str]] = collections.defaultdict(set)
    rows = []
    for result in results:
        for diff, count in result.counts:
            summed = counts[diff.feature]
            summed.in_scope += count.in_scope
            summed.matched += count.matched
            summed.differed += count.differed
            summed.otherwise += count.otherwise
            declarations[diff.feature] += 1
            runs[diff.feature].add(result.scenario)
            if detail:
                rows.append(f"    {result.scenario}: {count.render()}: {diff.where()}")
    sidecar = sum(r.by_kind.get("sidecar", 0) for r in results)
    lines = [f"  comparisons: {total} in {len(results)} runs"]
    if sidecar:
        status = sum(r.by_kind.get("status", 0) for r in results)
        lines[0] += f" (status: {status} of the node agent, {sidecar} of the sidecar)"
    for feature in sorted(counts):
        lines.append(
            f"  declared {feature}: {counts[feature].render()} ({declarations[feature]} "
            f"declarations in {len(runs[feature])} scenarios)"
        )
    return "\n".join(lines + rows)


def observed_json(line: str, scenario: str, obs: _compare.Observed) -> str:
    """One difference as a declaration would scope it (one JSON object)."""
    return json.dumps(
        {"line": line, "scenario": scenario, **dataclasses.asdict(obs)},
        ensure_ascii=False,
        default=str,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.conformance._suite")
    parser.add_argument("--line", action="append", help="kubelet line, e.g. 1.38 (repeatable)")
    parser.add_argument("--generated", type=int, default=0, help="generated scenarios to add")
    parser.add_argument("--only-generated", action="store_true")
    parser.add_argument(
        "--seed", type=int, action="append", default=[], help="a generated seed to add"
    )
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--write-matrix", action="store_true")
    parser.add_argument("--masked-detail", action="store_true", help="per declaration")
    parser.add_argument(
        "--dump-observed", type=pathlib.Path, help="write every difference (JSON lines) here"
    )
    parser.add_argument("--scenario-dir", type=pathlib.Path, default=sc.SCENARIO_DIR)
    parser.add_argument(
        "--allow-blanket", action="store_true", help="accept unscoped (old) declarations"
    )
    parser.add_argument("names", nargs="*", help="scenario names (default: all written)")
    ns = parser.parse_args(argv)
    sc.ALLOW_BLANKET = ns.allow_blanket
    scenarios = [] if ns.only_generated else sc.load_all(ns.scenario_dir)
    if ns.names:
        scenarios = [s for s in scenarios if s.name in ns.names]
    scenarios += generated(range(1, ns.generated + 1)) if ns.generated else []
    scenarios += generated(ns.seed) if ns.seed else []
    lines = ns.line or list(sc.LINES)
    status = 0
    results: dict[str, list[_runner.RunResult]] = {}
    helpers = {d.implementation for s in scenarios for d in s.drivers if d.go_helper}
    with contextlib.ExitStack() as stack:
        # Scenarios with a Go helper driver need a kube-apiserver (one for all lines).
        env = stack.enter_context(_godriver.started_env(helpers)) if helpers else None
        for line in lines:
            status |= _one_line(scenarios, line, ns.concurrency, env, results, ns.masked_detail)
            if ns.dump_observed:
                with ns.dump_observed.open("a", encoding="utf-8") as out:
                    for result in results[line]:
                        for obs in result.observed:
                            out.write(observed_json(line, result.scenario, obs) + "\n")
    if ns.write_matrix:
        _matrix.write([s for s in scenarios if not s.generated], results)
    return status


def _one_line(
    scenarios: Sequence[sc.Scenario],
    line: str,
    concurrency: int,
    env: _godriver.GoHelperEnv | None,
    results: dict[str, list[_runner.RunResult]],
    detail: bool = False,
) -> int:
    """Run one line, print its summary and failures, store its results; 1 if any failed."""
    from tests.conformance import _twin

    binary = str(_twin.binary(version_of(line)))
    began = time.monotonic()
    done = asyncio.run(run_line(scenarios, line, binary, concurrency=concurrency, gohelper=env))
    results[line] = done
    failed = [r for r in done if not r.ok]
    print(
        f"kubelet {line}: {len(done)} scenarios, {len(failed)} failed, "
        f"{time.monotonic() - began:.1f}s wall, slowest "
        f"{max((r.seconds for r in done), default=0):.1f}s",
        flush=True,
    )
    print(masked_summary(done, detail=detail), flush=True)
    for result in failed:
        print(result.report(), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The conformance suite: which scenarios, which lines, and the matrix they produce.

``python -m tests.conformance._suite [--line 1.37 ...] [--generated N] [--write-matrix]
[scenario ...]`` runs scenarios against the kubelet twin of each line, prints every
undeclared or missing difference and the wall time per line, and with
``--write-matrix`` rewrites the matrix section of ``docs/conformance.md``
from the results. The pytest tests (``test_conformance.py``) run the same.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Sequence

from tests.conformance import _generate, _godriver, _matrix, _runner, _twinlike
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.conformance._suite")
    parser.add_argument("--line", action="append", help="kubelet line, e.g. 1.38 (repeatable)")
    parser.add_argument("--generated", type=int, default=0, help="generated scenarios to add")
    parser.add_argument("--only-generated", action="store_true")
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--write-matrix", action="store_true")
    parser.add_argument("names", nargs="*", help="scenario names (default: all written)")
    ns = parser.parse_args(argv)
    scenarios = [] if ns.only_generated else written()
    if ns.names:
        scenarios = [s for s in scenarios if s.name in ns.names]
    scenarios += generated(range(1, ns.generated + 1)) if ns.generated else []
    lines = ns.line or list(sc.LINES)
    status = 0
    results: dict[str, list[_runner.RunResult]] = {}
    helpers = {d.implementation for s in scenarios for d in s.drivers if d.go_helper}
    with contextlib.ExitStack() as stack:
        # Scenarios with a Go helper driver need a kube-apiserver (one for all lines).
        env = stack.enter_context(_godriver.started_env(helpers)) if helpers else None
        for line in lines:
            status |= _one_line(scenarios, line, ns.concurrency, env, results)
    if ns.write_matrix:
        _matrix.write([s for s in scenarios if not s.generated], results)
    return status


def _one_line(
    scenarios: Sequence[sc.Scenario],
    line: str,
    concurrency: int,
    env: _godriver.GoHelperEnv | None,
    results: dict[str, list[_runner.RunResult]],
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
    for result in failed:
        print(result.report(), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

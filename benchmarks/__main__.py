"""The benchmark runner: ``python -m benchmarks [--quick] [--only NAME[,NAME]] [--compare F]``.

Runs the scenarios of issues 7 and 15 (see ``docs/performance.md`` and
``docs/scaling.md``), prints a markdown table per scenario and a final summary,
and exits 1 when any scenario ended in a wrong state (a fast wrong answer is a
failure). A missed target is reported in the summary but does not fail the run.
With ``--compare BASELINE.json`` (a file ``--json`` wrote) each summary ratio is
printed against the saved run's and the exit code is 3 when one got more than
25 % worse in its direction (exit 1 still wins). ``fleet`` (many nodes against a
real kube-apiserver) needs the interop suite's Go binaries and runs only when
named with ``--only``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import time
import traceback

from benchmarks import _common as c
from benchmarks import _compare

SCENARIOS = (
    "ingest",
    "latency",
    "storm",
    "persistence",
    "restart",
    "memory",
    "apiload",
    "deadline",
    "kubectl",
)
#: Scenarios that run only when named with --only (they need Go-built binaries).
EXTRA = ("fleet",)
EXIT_REGRESSED = 3


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short run (under two minutes)")
    parser.add_argument("--only", default="", help=f"comma list of: {', '.join(SCENARIOS + EXTRA)}")
    parser.add_argument("--json", help="also write the summary rows to this file")
    parser.add_argument(
        "--compare",
        metavar="BASELINE.json",
        help="compare each summary ratio with a saved --json run; exit 3 if one got "
        f"more than {_compare.TOLERANCE:.0%}% worse",  # "%%": argparse formats help with %
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    chosen = [s for s in ns.only.split(",") if s] or list(SCENARIOS)
    unknown = sorted(set(chosen) - set(SCENARIOS + EXTRA))
    if unknown:
        print(f"unknown scenario(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    baseline: list[dict[str, object]] | None = None
    if ns.compare:
        try:
            baseline = _compare.load_rows(ns.compare)
        except ValueError as exc:
            print(str(exc), file=sys.stderr)
            return 2
    info = c.machine()
    command = "python -m benchmarks" + (" --quick" if ns.quick else "")
    command += f" --only {ns.only}" if ns.only else ""
    print(f"# kubelet-dra benchmarks ({'quick' if ns.quick else 'full'})\n")
    print(
        f"Machine: {info['nproc']} CPUs, {info['cpu']}, Python {info['python']}, "
        f"{info['platform']}; load average at start {info['load']}. Command: `{command}`\n"
    )
    outcomes: list[c.Outcome] = []
    started = time.perf_counter()
    for name in chosen:
        module = importlib.import_module(f"benchmarks.{name}")
        config = module.QUICK if ns.quick else module.FULL
        t0 = time.perf_counter()
        print(f"## {name}\n", flush=True)
        try:
            outcome = asyncio.run(module.run(config))
        except c.CheckFailed as exc:
            outcome = c.Outcome(name, failures=[f"WRONG RESULT: {exc}"])
        except Exception as exc:
            outcome = c.Outcome(name, failures=[f"ERROR: {type(exc).__name__}: {exc}"])
            traceback.print_exc()
        outcomes.append(outcome)
        for table in outcome.tables:
            print(table + "\n")
        for note in outcome.notes:
            print(f"- {note}")
        for failure in outcome.failures:
            print(f"- **FAILED**: {failure}")
        print(f"\n({name}: {time.perf_counter() - t0:.1f} s)\n", flush=True)
    rows = [row for o in outcomes for row in o.summary]
    print(
        c.markdown_table(
            "Summary (medians; ratios against a floor or baseline measured in the same run)",
            ["scenario", "figure", "floor / baseline", "ratio", "target", "met"],
            [(r.scenario, r.figure, r.floor, r.ratio, r.target, c.met_mark(r.met)) for r in rows],
        )
    )
    failed = [o.name for o in outcomes if o.failures]
    for outcome in outcomes:
        outcome.failures = [
            f if f.startswith(("WRONG", "ERROR")) else f"WRONG RESULT: {f}"
            for f in outcome.failures
        ]
    print(
        f"\nTotal {time.perf_counter() - started:.0f} s; load average at end {c.machine()['load']}."
    )
    if ns.json:
        with open(ns.json, "w") as fh:
            json.dump(
                {"machine": info, "command": command, "rows": [r.__dict__ for r in rows],
                 "failures": {o.name: o.failures for o in outcomes if o.failures}},
                fh, indent=2,
            )  # fmt: skip
    regressed = _print_comparison(baseline, rows, ns.compare) if baseline is not None else []
    if failed:
        print(f"\nFAILED (wrong final state or error): {', '.join(failed)}")
        return 1
    if regressed:
        print(f"\nREGRESSED against {ns.compare}: {', '.join(regressed)}")
        return EXIT_REGRESSED
    return 0


def _print_comparison(
    baseline: list[dict[str, object]], rows: list[c.SummaryRow], path: str
) -> list[str]:
    """Print this run's ratios against the baseline's; return the regressed rows."""
    current = [r.__dict__ for r in rows]
    names = {str(r["scenario"]) for r in current}
    # A partial run (--only) is compared on its own rows, not failed for the others.
    found = [cmp for cmp in _compare.compare(baseline, current) if cmp.scenario in names]
    print()
    print(
        c.markdown_table(
            f"Against {path} (ratios to the floor of each run; worse by more than "
            f"{_compare.TOLERANCE:.0%} fails)",
            ["scenario", "better", "baseline", "now", "change", "verdict"],
            _compare.table_rows(found),
        )
    )
    return [cmp.scenario for cmp in found if cmp.regressed]


if __name__ == "__main__":
    sys.exit(main())

"""``python -m tests.soak [--minutes N] [--seed S] [--out DIR]``: one soak run (``tox -e soak``).

Prints the schedule first (replay a failing run with its ``--seed`` and ``--minutes``),
then the summary table; writes schedule.json, samples.csv, faults.json, summary.json,
summary.md, soak.png and every process's log to the output dir. Exit 0 when every check
passed, 1 when one failed.
"""

from __future__ import annotations

import argparse
import faulthandler
import random
import signal
import sys
import tempfile
from pathlib import Path

from . import _parts as parts
from . import _report
from ._run import Options, Soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=60.0, help="length (default 60)")
    parser.add_argument("--seed", type=int, default=None, help="schedule seed (default: random)")
    parser.add_argument("--out", type=Path, default=None, help="output dir (default: a temp dir)")
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG")
    parser.add_argument(
        "--kubelet",
        default="auto",
        help="the real kubelet's line beside the sidecar (1.37, 1.38), 'none', or 'auto' "
        "(default: 1.37 where it can run: root, unshare, Go builds; else none, saying why)",
    )
    parser.add_argument(
        "--sidecar-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the sidecar alone, as a DaemonSet's env sets it "
        "(repeatable; e.g. PYTHONMALLOC=malloc)",
    )
    parser.add_argument(
        "--trace-python-memory",
        action="store_true",
        help="trace the sidecar's Python allocations (PYTHONTRACEMALLOC) and keep a snapshot a "
        "minute in OUT/tracemalloc for python -m tests.soak.tracediff; its RSS is then not "
        "the product's",
    )
    ns = parser.parse_args(argv)
    try:
        extra = parts.parse_env(ns.sidecar_env)
    except ValueError as exc:
        parser.error(str(exc))
    seed = ns.seed if ns.seed is not None else random.SystemRandom().randrange(1, 10**6)
    out = ns.out or Path(tempfile.mkdtemp(prefix=f"kdra-soak-{seed}-"))
    if ns.trace_python_memory:
        extra = {**parts.trace_env(out / "tracemalloc"), **extra}
    kubelet, why_not = parts.choose_kubelet(ns.kubelet)
    if why_not:
        print(f"soak: {why_not}", flush=True)
        if ns.kubelet != "auto":
            return 2
    faulthandler.register(signal.SIGUSR1)  # a stuck run: kill -USR1 <pid> prints every stack
    print(f"soak: seed {seed}, {ns.minutes:g} minutes, output in {out}", flush=True)
    opts = Options(ns.minutes, seed, out, chart=not ns.no_chart, kubelet=kubelet, sidecar_env=extra)
    print(f"soak: real kubelet: {kubelet or 'none'}", flush=True)
    summary = Soak(opts).run()
    print(_report.table(summary))
    for key in ("lost_final_states", "unknown_blips", "refused_invalid", "harness_errors"):
        for item in summary[key][:10]:
            print(f"{key}: {item}")
    print(f"soak: {'PASS' if summary['ok'] else 'FAIL'}; outputs in {out}", flush=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

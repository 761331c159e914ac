#!/usr/bin/env python3
"""Build every Go binary the CI run needs, two at a time, before the tests start.

The test suites build what they need on first use, one binary at a time. On a cold cache
that is most of CI's time, and a serial build leaves a core idle through each binary's
download and single-threaded link. Two builds at once keep both cores busy; the Go build
cache shares the packages that the kube-apiserver, the scheduler, the controller manager,
the kubelet and the 1.37 twin have in common, so the big ones go first.

Prints one line per binary and a table of build seconds at the end (the figures quoted in
docs/e2e.md for the cold budget). Exit status 1 when a build failed; a build that is
unavailable (no Go, no module proxy) fails too with ``CI`` set, as the tests' skips do
there (tests/_skipguard.py), and is only reported without it.

Usage: python3 .ci/prebuild.py [--jobs N] [name ...]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import _skipguard  # noqa: E402
from tests.conformance import _twin  # noqa: E402
from tests.interop import _build  # noqa: E402

#: The default CI run's binaries, largest (and most shared) first.
ORDER = (
    "kube-apiserver",
    "kubelet-1.37",
    "twin:v1.37.2",
    "kube-controller-manager",
    "kube-scheduler",
    "etcd",
    "driver-current",
    "driver-v035",
    "fakecri",
    "twin:v1.38.0-beta.0",
    "twin:v1.36.4",
    "twin:v1.35.5",
    "twin:v1.34.4",
    "helm",
    "helm3",
    "promtool",
    "kubectl",
    "validate-krew-manifest",
    "grafana-dashboard-check",
)


def build(name: str) -> tuple[str, float, str]:
    start = time.monotonic()
    try:
        if name.startswith("twin:"):
            path = _twin.binary(name.removeprefix("twin:"), log=False)
        else:
            path = _build.ensure(name, log=False)
    except _build.BuildUnavailable as exc:
        return name, time.monotonic() - start, f"unavailable: {exc.reason}"
    except _build.BuildFailed as exc:
        return name, time.monotonic() - start, f"FAILED: {exc}"
    return name, time.monotonic() - start, str(path.relative_to(_build.cache_root()))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    names = args.names or list(ORDER)
    begin = time.monotonic()
    results = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for name, seconds, what in pool.map(build, names):
            print(f"[prebuild] {name}: {seconds:.0f}s {what}", flush=True)
            results.append((name, seconds, what))
    failing = ("FAILED", "unavailable") if _skipguard.ci_enabled() else ("FAILED",)
    failed = [name for name, _, what in results if what.startswith(failing)]
    print(f"[prebuild] {len(results)} binaries in {time.monotonic() - begin:.0f}s wall "
          f"({args.jobs} at a time); failed: {failed or 'none'}", flush=True)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

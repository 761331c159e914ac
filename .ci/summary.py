#!/usr/bin/env python3
"""Print one line per tox environment of a run: its pytest counts, its seconds, its exit.

tox run-parallel shows an environment's output only when it fails, so a green log says
nothing of what ran. This reads tox's ``--result-json`` (exit code and seconds per
environment) and each environment's junit XML (``tox.ini`` writes
``<toxworkdir>/junit/<env>.xml``), and prints, in the run's order::

    [ci] py           2255 passed, 0 failed, 0 errors, 0 skipped   512 s  exit 0

An environment that runs no pytest (lint, type) shows ``no pytest``; ``.ci/run`` empties the
junit directory before the run, so no file is left from an earlier one. Exit status: 0,
whatever the run did; the caller owns the verdict.

Usage: python3 .ci/summary.py RESULT_JSON JUNIT_DIR
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def pytest_counts(xml_path: Path) -> str:
    """``N passed, N failed, N errors, N skipped`` from a junit file, or ``no pytest``."""
    if not xml_path.exists():
        return "no pytest"
    root = ET.parse(xml_path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {key: sum(int(s.get(key, 0)) for s in suites)
             for key in ("tests", "failures", "errors", "skipped")}  # fmt: skip
    passed = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    return (f"{passed} passed, {total['failures']} failed, {total['errors']} errors, "
            f"{total['skipped']} skipped")  # fmt: skip


def lines(result: dict[str, Any], junit_dir: Path) -> list[str]:
    # tox lists every environment it knows (and its packaging one); those that ran have a
    # result.
    envs: dict[str, Any] = {k: v for k, v in result.get("testenvs", {}).items() if "result" in v}
    width = max((len(name) for name in envs), default=0)
    out = []
    for name, env in envs.items():
        outcome = env.get("result", {})
        seconds = outcome.get("duration", 0.0)
        code = outcome.get("exit_code", "?")
        counts = pytest_counts(junit_dir / f"{name}.xml")
        out.append(f"[ci] {name:<{width}}  {counts:<48} {seconds:6.0f} s  exit {code}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.splitlines()[-1], file=sys.stderr)
        return 0
    result_path, junit_dir = Path(argv[0]), Path(argv[1])
    if not result_path.exists():
        print(f"[ci] no tox result at {result_path.name}: tox did not get to run")
        return 0
    result = json.loads(result_path.read_text())
    for line in lines(result, junit_dir):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

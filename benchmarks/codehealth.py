"""Code-health figures of the package, computed the same way before and after a refactor.

Not a timing benchmark: it reads the source (``ast``) and prints

- the median and p90 length of every function and method in ``kubelet_dra``
  (generated ``_proto`` excluded), in lines from ``def`` to its last line;
- the class with the most methods (functions defined directly in its body);
- docstring coverage of public methods: functions defined directly in a
  class body whose name does not start with ``_`` (dunders excluded too);
- the same for public functions and methods (module-level public functions too);
- hand-written pod JSON reading: ``.get("metadata"|"spec"|"status") or {}``
  chains, ``or "default"`` namespace fallbacks and ``Obj = ...`` aliases;
- the pair count of the external ``duplicates`` tool (when it is on ``PATH``)
  over the checkout, rows touching generated code (``_proto``) dropped, split
  into the package and the rest (tests, benchmarks).

Run from the checkout: ``python -m benchmarks.codehealth [--by-file] [--json]``.
``--by-file`` adds per-module figures, ``--json`` prints one JSON object.
Percentiles are nearest-rank (the value at rank ceil(p * n)).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kubelet_dra"
GENERATED = "_proto"
_CHAIN = re.compile(r"""\.get\(["'](metadata|spec|status)["']\) or \{\}""")
_DEFAULT_NS = re.compile(r"""or ["']default["']""")
_OBJ_ALIAS = re.compile(r"^Obj\b.*=", re.MULTILINE)
_ROW = re.compile(r"^D\d+ (\S+?):\d+-\d+ ~ (\S+?):\d+-\d+")


def source_files(package: pathlib.Path = PACKAGE) -> list[pathlib.Path]:
    """Every hand-written module of the package."""
    return sorted(p for p in package.rglob("*.py") if GENERATED not in p.relative_to(ROOT).parts)


def function_lengths(tree: ast.AST) -> list[tuple[str, int]]:
    """(qualified-ish name, length in lines) of every function, nested ones too."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            end = node.end_lineno or node.lineno
            found.append((node.name, end - node.lineno + 1))
    return found


def class_methods(tree: ast.AST) -> list[tuple[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]]:
    """Every class with the functions defined directly in its body."""
    return [
        (node.name, [m for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)])
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    ]


def percentile(values: list[int], p: float) -> int:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


def measure(files: list[pathlib.Path]) -> dict[str, Any]:
    lengths: list[int] = []
    classes: list[tuple[str, int]] = []
    public = documented = functions = functions_documented = 0
    chains = defaults = aliases = 0
    for path in files:
        text = path.read_text()
        tree = ast.parse(text, filename=str(path))
        chains += len(_CHAIN.findall(text))
        defaults += len(_DEFAULT_NS.findall(text))
        aliases += len(_OBJ_ALIAS.findall(text))
        for node in tree.body:
            public_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if public_function and not node.name.startswith("_"):
                functions += 1
                functions_documented += ast.get_docstring(node) is not None
        lengths += [n for _, n in function_lengths(tree)]
        for name, methods in class_methods(tree):
            classes.append((f"{path.relative_to(ROOT)}:{name}", len(methods)))
            for method in methods:
                if not method.name.startswith("_"):
                    public += 1
                    documented += ast.get_docstring(method) is not None
    largest = max(classes, key=lambda c: c[1], default=("", 0))
    return {
        "functions": len(lengths),
        "median_length": statistics.median(lengths) if lengths else 0,
        "p90_length": percentile(lengths, 0.9) if lengths else 0,
        "max_length": max(lengths, default=0),
        "largest_class": largest[0],
        "largest_class_methods": largest[1],
        "public_methods": public,
        "public_methods_documented": documented,
        "docstring_coverage": _ratio(documented, public),
        "docstring_coverage_with_functions": _ratio(
            documented + functions_documented, public + functions
        ),
        "pod_json_chains": chains,
        "default_namespace_fallbacks": defaults,
        "obj_aliases": aliases,
    }


def _ratio(part: int, whole: int) -> float:
    return round(100 * part / whole, 1) if whole else 100.0


def duplicate_pairs(root: pathlib.Path = ROOT) -> dict[str, Any] | None:
    """Pairs the ``duplicates`` tool lists, generated code dropped; ``None`` without it."""
    tool = shutil.which("duplicates")
    if tool is None:
        return None
    out = subprocess.run(
        [tool, "--repo", str(root), "--most", "200", "--seconds", "120"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    package = other = 0
    for line in out.splitlines():
        match = _ROW.match(line)
        if match is None or any(GENERATED in side for side in match.groups()):
            continue
        if any(side.startswith("kubelet_dra/") for side in match.groups()):
            package += 1
        else:
            other += 1
    return {"package": package, "other": other, "total": package + other}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--by-file", action="store_true", help="figures per module too")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    files = source_files()
    report: dict[str, Any] = {"package": measure(files), "duplicates": duplicate_pairs()}
    if args.by_file:
        report["by_file"] = {str(p.relative_to(ROOT)): measure([p]) for p in files}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for key, value in report["package"].items():
        print(f"{key:36} {value}")
    print(f"{'duplicates':36} {report['duplicates'] or 'tool not on PATH'}")
    for name, figures in report.get("by_file", {}).items():
        print(
            f"{name:45} fns {figures['functions']:3} median {figures['median_length']:5} "
            f"p90 {figures['p90_length']:3} max {figures['max_length']:3} largest class "
            f"{figures['largest_class_methods']:3} doc {figures['docstring_coverage']}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

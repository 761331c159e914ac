"""docs/testing.md lists every mutant that ``tests/mutation/score.py`` declares equivalent.

The mutation score subtracts the mutants in ``score.EQUIVALENT``; the docs must
give each one with its reason, so a declaration cannot hide a mutant unseen.
"""

from __future__ import annotations

import ast
import pathlib
import re

from tests.mutation import score

DOC = pathlib.Path(__file__).parents[2] / "docs" / "testing.md"


def _short(name: str) -> tuple[str, str]:
    return score.short_name(name)


def _numbers(cell: str) -> set[str]:
    # "7, 11" or "21-24" after the function's name
    out: set[str] = set()
    for first, last in re.findall(r"(\d+)(?:-(\d+))?", cell):
        out.update(str(n) for n in range(int(first), int(last or first) + 1))
    return out


def documented() -> set[tuple[str, str]]:
    """(function, number) of every row of the docs' tables of surviving mutants."""
    found: set[tuple[str, str]] = set()
    for line in DOC.read_text().splitlines():
        cell = line.split("|")[1] if line.startswith("|") else ""
        for function, rest in re.findall(r"`([\w./]+)`([^`]*)", cell):
            found.update((function, number) for number in _numbers(rest))
    return found


def test_every_declared_equivalent_is_in_the_docs_with_its_number() -> None:
    rows = documented()
    missing = [name for name in score.EQUIVALENT if _short(name) not in rows]
    assert not missing, f"declared equivalent in score.py but not in docs/testing.md: {missing}"


def test_every_declared_equivalent_is_in_scope_and_has_a_reason() -> None:
    for name, reason in score.EQUIVALENT.items():
        module = next(m for m in score.MODULES if name.startswith(score.dotted(m) + "."))
        assert score.in_scope(module, name), name
        assert len(reason) > 20, name


def _defined(path: pathlib.Path) -> set[str]:
    """Every function and method of a module, named as mutmut names it."""
    tree = ast.parse(path.read_text())
    names = {f"x_{n.name}" for n in tree.body if isinstance(n, ast.FunctionDef)}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        names |= {f"xǁ{cls.name}ǁ{f.name}" for f in cls.body if isinstance(f, ast.FunctionDef)}
    return names


def test_every_function_in_a_narrowed_scope_exists() -> None:
    # A renamed function left in SCOPE is mutated by no run, silently (the store's
    # _validate_rows, renamed _load_rows, was out of every run until 2026-12-04).
    root = pathlib.Path(__file__).parents[2]
    for label, functions in score.SCOPE.items():
        missing = sorted(set(functions) - _defined(root / score.MODULES[label]))
        assert not missing, f"{label}: {missing} are not in {score.MODULES[label]}"

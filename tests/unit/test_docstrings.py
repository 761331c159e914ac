"""Docstrings in ``kubelet_dra/`` say what and why; measurements and history live elsewhere.

A module docstring says what the module owns and its kubelet counterpart in a few lines (the
rules go to the class or function they describe), and no docstring of the package narrates
how a figure was measured or which project issue brought the code: that is what the
decision records under ``docs/decisions/``, the CHANGELOG and git are for.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "kubelet_dra"
MODULE_DOCSTRING_MAX_LINES = 15
#: Words that narrate measurement or history, not what the code does.
NARRATION = re.compile(r"\b(measured|profiled|issue \d+|the soak)\b", re.IGNORECASE)


def _modules() -> list[pathlib.Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_proto" not in p.parts)


def _docstrings(tree: ast.Module) -> list[tuple[str, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                found.append((getattr(node, "name", "<module>"), text))
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_docstring_is_short(path: pathlib.Path) -> None:
    text = ast.get_docstring(ast.parse(path.read_text()), clean=False)
    assert text, f"{path.relative_to(PACKAGE)} has no module docstring"
    lines = len(text.strip().splitlines())
    assert lines <= MODULE_DOCSTRING_MAX_LINES, (
        f"{path.relative_to(PACKAGE)}: module docstring of {lines} lines; say what the module "
        "owns and its kubelet counterpart, and move the rules to the class or function"
    )


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_docstring_narrates_measurements_or_history(path: pathlib.Path) -> None:
    hits = [
        f"{name}: {match.group(0)!r}"
        for name, text in _docstrings(ast.parse(path.read_text()))
        for match in NARRATION.finditer(text)
    ]
    assert not hits, f"{path.relative_to(PACKAGE)}: {hits} (docs/decisions/ or the CHANGELOG)"

"""``docs/architecture.md`` against the tree: its module table and the counts it gives.

- every module and package directly under ``kubelet_dra/`` has a row of the module table
  (``__init__.py`` and ``__main__.py`` aside), and every path a row names exists;
- the number of ``testing/fakeapi/_*`` modules the Layout section gives is the number there is.
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kubelet_dra"
DOC = (ROOT / "docs" / "architecture.md").read_text()
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def table_paths(text: str) -> set[str]:
    """The ``x.py`` and ``x/`` paths in the first column of the module table."""
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    return {p for row in rows for p in re.findall(r"`([\w/]+(?:\.py|/))`", row.split("|")[1])}


def top_level() -> set[str]:
    found = {p.name for p in PACKAGE.glob("*.py")} - {"__init__.py", "__main__.py"}
    return found | {f"{p.parent.name}/" for p in PACKAGE.glob("*/__init__.py")}


def test_every_top_level_module_has_a_row() -> None:
    assert sorted(top_level() - table_paths(DOC)) == []


def test_every_row_names_modules_that_exist() -> None:
    assert sorted(p for p in table_paths(DOC) if not (PACKAGE / p).exists()) == []


def fakeapi_count(text: str) -> int:
    match = re.search(r"The (\w+) `testing/fakeapi/_\*` modules", text)
    assert match is not None, "the Layout section no longer counts the fakeapi modules"
    return NUMBERS.index(match.group(1))


def test_the_fakeapi_module_count_is_right() -> None:
    assert fakeapi_count(DOC) == len(list((PACKAGE / "testing" / "fakeapi").glob("_[!_]*.py")))


def test_the_checks_see_a_stale_doc() -> None:
    assert fakeapi_count("The eight `testing/fakeapi/_*` modules") == 8
    stale = "| `models.py` | x | y |\n| `_kube_api.py` | x | y |\n"
    assert table_paths(stale) == {"models.py", "_kube_api.py"}
    assert not (PACKAGE / "_kube_api.py").exists()

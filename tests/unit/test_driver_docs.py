"""``docs/drivers.md``'s test examples are the tested files of ``examples/driver-tests``.

A fenced ``python`` block whose first line is ``# examples/driver-tests/<file>.py`` must be
a part of that file, line for line (after that first line): the file is what
``tox -e package`` runs with pytest from the installed wheel, so the page shows code that
passed. The files themselves use only the public names (``test_public_surface`` checks
the blocks; this checks the files too).
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

from tests.unit.test_public_surface import non_public_uses

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "drivers.md"
EXAMPLES = ROOT / "examples" / "driver-tests"
_FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_SOURCE = re.compile(r"# (examples/driver-tests/[\w.-]+\.py)\n")


def excerpts() -> list[tuple[str, str]]:
    found = []
    for block in _FENCE.findall(DOC.read_text()):
        first = _SOURCE.match(block)
        if first:
            found.append((first.group(1), block[first.end() :]))
    return found


def is_part_of(excerpt: str, text: str) -> bool:
    """Whether the lines of ``excerpt`` are consecutive lines of ``text``."""
    want, have = excerpt.strip("\n").splitlines(), text.splitlines()
    return any(have[i : i + len(want)] == want for i in range(len(have) - len(want) + 1))


def test_the_page_shows_example_files() -> None:
    assert {path for path, _ in excerpts()} >= {
        "examples/driver-tests/test_node_agent.py",
        "examples/driver-tests/test_api_server.py",
    }


@pytest.mark.parametrize(("path", "excerpt"), excerpts(), ids=lambda v: v[:40])
def test_each_excerpt_is_part_of_its_file(path: str, excerpt: str) -> None:
    assert is_part_of(excerpt, (ROOT / path).read_text()), f"{path} does not hold:\n{excerpt}"


def test_the_excerpt_check_sees_a_changed_line() -> None:
    text = "a = 1\nb = 2\nc = 3\n"
    assert is_part_of("b = 2\nc = 3\n", text)
    assert not is_part_of("b = 2\nc = 4\n", text)
    assert not is_part_of("a = 1\nc = 3\n", text)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_example_files_use_only_public_names(path: pathlib.Path) -> None:
    assert non_public_uses(ast.parse(path.read_text())) == []


def test_the_example_tree_has_no_conftest() -> None:
    assert not list(EXAMPLES.rglob("conftest.py"))

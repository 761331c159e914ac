"""The import rules of ``docs/architecture.md`` (Layout), checked on the source.

- the library never imports a command (``kubelet_dra.commands``, ``kubelet_dra.cli``);
- the state side (``models``, ``healthinfo``, ``store``) never imports the plugin side
  (``registration``, ``plugins``, ``_streams``).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "kubelet_dra"
COMMANDS = ("kubelet_dra.commands", "kubelet_dra.cli", "kubelet_dra.__main__")
STATE_SIDE = ("kubelet_dra.models", "kubelet_dra.healthinfo", "kubelet_dra.store")
PLUGIN_SIDE = ("kubelet_dra.registration", "kubelet_dra.plugins", "kubelet_dra._streams")


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: pathlib.Path) -> set[str]:
    """Every ``kubelet_dra`` module ``path`` imports (``from kubelet_dra import x`` as ``.x``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("kubelet_dra")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kubelet_dra"):
            found.add(node.module or "")
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


LIBRARY = [
    p
    for p in sorted(PACKAGE.rglob("*.py"))
    if "_proto" not in p.parts
    and not _under(module_name(p), COMMANDS)
    and module_name(p) != "kubelet_dra"  # the package keeps the old command paths importable
]


@pytest.mark.parametrize("path", LIBRARY, ids=module_name)
def test_the_library_never_imports_a_command(path: pathlib.Path) -> None:
    assert not {name for name in imports_of(path) if _under(name, COMMANDS)}


@pytest.mark.parametrize(
    "path", [PACKAGE / f"{m.rsplit('.', 1)[1]}.py" for m in STATE_SIDE], ids=str
)
def test_the_state_side_never_imports_the_plugin_side(path: pathlib.Path) -> None:
    assert not {name for name in imports_of(path) if _under(name, PLUGIN_SIDE)}


def test_the_checker_sees_both_import_forms(tmp_path: pathlib.Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from kubelet_dra import cli\nimport kubelet_dra.commands.watch\n")
    assert {"kubelet_dra.cli", "kubelet_dra.commands.watch"} <= imports_of(sample)

"""The declared public surface: ``kubelet_dra.__all__`` and ``kubelet_dra.testing.__all__``.

Every declared name imports; ``docs/library.md`` lists exactly those names; the
Python code in ``docs/`` (fenced ``python`` blocks and ``docs/examples/*.py``)
imports and uses only them.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

import pytest

import kubelet_dra
import kubelet_dra.testing

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PUBLIC: dict[str, frozenset[str]] = {
    "kubelet_dra": frozenset(kubelet_dra.__all__),
    "kubelet_dra.testing": frozenset(kubelet_dra.testing.__all__),
}
_FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_declared_name_imports(module: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {module} import *", namespace)  # the star import is what is tested
    missing = sorted(PUBLIC[module] - set(namespace))
    assert not missing, f"{module}.__all__ names that do not import: {missing}"
    imported = importlib.import_module(module)
    for name in PUBLIC[module]:
        assert getattr(imported, name) is namespace[name]


def test_library_doc_lists_exactly_the_public_names() -> None:
    text = (DOCS / "library.md").read_text()
    section = text[text.index("## The public surface") :]
    listed = set(re.findall(r"^\|[^|]*\|", section, re.MULTILINE))
    names = {n for row in listed for n in re.findall(r"`([A-Za-z_]\w*)`", row)}
    assert names - set(PUBLIC) == PUBLIC["kubelet_dra"] | PUBLIC["kubelet_dra.testing"]


def _doc_sources() -> list[tuple[str, str]]:
    sources = [
        (f"{path.name} block {n}", block)
        for path in sorted(DOCS.glob("*.md"))
        for n, block in enumerate(_FENCE.findall(path.read_text()), 1)
    ]
    # The examples a user copies; docs/generate.py is the site's own tool, not an example.
    examples = sorted((DOCS / "examples").rglob("*.py"))
    sources += [(str(p.relative_to(ROOT)), p.read_text()) for p in examples]
    return sources


def _parse(source: str, where: str) -> ast.Module:
    # Doc blocks are snippets with top-level ``await`` and ``async with``.
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(source, where, "exec", flags=flags, dont_inherit=True)
    assert isinstance(tree, ast.Module)
    return tree


def non_public_uses(tree: ast.Module) -> list[str]:
    """Every ``kubelet_dra`` import or attribute in ``tree`` that is not declared public."""
    bad: list[str] = []
    modules: dict[str, str] = {}  # local name -> public module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "kubelet_dra":
                    continue
                if alias.name not in PUBLIC:
                    bad.append(f"import {alias.name}")
                elif alias.asname:
                    modules[alias.asname] = alias.name
                else:
                    modules["kubelet_dra"] = "kubelet_dra"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kubelet_dra"):
            module = node.module or ""
            if module not in PUBLIC:
                bad.append(f"from {module} import ...")
                continue
            for alias in node.names:
                if f"{module}.{alias.name}" in PUBLIC:
                    modules[alias.asname or alias.name] = f"{module}.{alias.name}"
                elif alias.name not in PUBLIC[module]:
                    bad.append(f"from {module} import {alias.name}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        dotted = _dotted(node)
        if dotted is None or dotted[0] not in modules:
            continue
        module, rest = modules[dotted[0]], dotted[1:]
        if module == "kubelet_dra" and rest[:1] == ["testing"]:
            module, rest = "kubelet_dra.testing", rest[1:]
        if rest and rest[0] not in PUBLIC[module] and _outermost(node, tree):
            bad.append(".".join([module, *rest]))
    return sorted(set(bad))


def _dotted(node: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.insert(0, node.attr)
        node = node.value
    return [node.id, *parts] if isinstance(node, ast.Name) else None


def _outermost(node: ast.Attribute, tree: ast.Module) -> bool:
    # Report ``a.b.c`` once, not also its inner ``a.b``.
    return not any(
        isinstance(parent, ast.Attribute) and parent.value is node for parent in ast.walk(tree)
    )


@pytest.mark.parametrize(("where", "source"), _doc_sources(), ids=lambda v: v[:40])
def test_docs_use_only_public_names(where: str, source: str) -> None:
    assert non_public_uses(_parse(source, where)) == []


def test_the_checker_catches_private_uses() -> None:
    # The docs' own uses before the surface was declared, each one caught.
    source = """
import kubelet_dra
from kubelet_dra.status import podstatus
from kubelet_dra.testing.fakedriver_control import FakeDriverClient
from kubelet_dra.testing import FakeDriver, fakedriver
podstatus.merge({}, None, now=0)
kubelet_dra.status.podstatus.find_condition({}, "DeviceHealthy")
kubelet_dra.testing.FakeDriver
kubelet_dra.DRAHealthManager
"""
    assert non_public_uses(_parse(source, "sample")) == [
        "from kubelet_dra.status import ...",
        "from kubelet_dra.testing import fakedriver",
        "from kubelet_dra.testing.fakedriver_control import ...",
        "kubelet_dra.status.podstatus.find_condition",
    ]

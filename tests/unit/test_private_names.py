"""The private-name rule of ``docs/architecture.md`` (Layout), checked on the source.

A name with a leading underscore is private to where it is defined:

- a private module (``_x.py`` or ``_x/``) is imported only by the modules of the package
  that holds it (its siblings and that package's ``__init__``), never from a subpackage or
  another package; they reach it through a public module;
- a private function, class or constant (``_x`` in a module) is used only in its module:
  never imported by name nor read as ``module._x`` from another module.

Generated code (``kubelet_dra/_proto``) is outside the rule: the plugin side and the fake
driver both speak it. Tests may use private names (they test them).
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "kubelet_dra"
GENERATED = "kubelet_dra._proto"


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(path: pathlib.Path) -> str:
    """The package a module is part of (a package's ``__init__`` is part of itself)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1])


def _is_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except ModuleNotFoundError:
        return False


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _module_violation(importer_package: str, target: str) -> str | None:
    """Why importing module ``target`` from a module of ``importer_package`` breaks the rule."""
    if _under(target, GENERATED):
        return None
    parts = target.split(".")
    for i, part in enumerate(parts):
        if _private(part) and ".".join(parts[:i]) != importer_package:
            return f"private module {target} imported from outside {'.'.join(parts[:i])}"
    return None


def violations(path: pathlib.Path, tree: ast.Module | None = None) -> list[str]:
    """Every use of another module's private name in the source at ``path``."""
    tree = tree or ast.parse(path.read_text())
    own = package_of(path)
    found: list[str] = []
    modules: set[str] = set()  # local names bound to kubelet_dra modules
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "kubelet_dra":
                    found.append(_module_violation(own, alias.name) or "")
                    modules.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kubelet_dra"):
            module = node.module or ""
            found.append(_module_violation(own, module) or "")
            for alias in node.names:
                dotted = f"{module}.{alias.name}"
                if _is_module(dotted):
                    found.append(_module_violation(own, dotted) or "")
                    modules.add(alias.asname or alias.name)
                elif _private(alias.name) and not _under(module, GENERATED):
                    found.append(f"private name {alias.name} imported from {module}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and _private(node.attr)
            and not _is_module(f"{_resolve(tree, node.value.id)}.{node.attr}")
        ):
            found.append(f"private name {node.value.id}.{node.attr} read from another module")
    return sorted({f for f in found if f})


def _resolve(tree: ast.Module, local: str) -> str:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if (alias.asname or alias.name) == local:
                    return f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if (alias.asname or alias.name.split(".")[0]) == local:
                    return alias.name if alias.asname else local
    return local


SOURCES = [p for p in sorted(PACKAGE.rglob("*.py")) if "_proto" not in p.parts]


@pytest.mark.parametrize("path", SOURCES, ids=module_name)
def test_private_names_stay_where_they_are_defined(path: pathlib.Path) -> None:
    assert violations(path) == []


def test_the_checker_catches_each_kind_of_private_use(tmp_path: pathlib.Path) -> None:
    sample = PACKAGE / "commands" / "sample.py"  # never written: parsed from a string
    tree = ast.parse(
        "from kubelet_dra.kubectl import _model\n"
        "from kubelet_dra.plugin import plugins\n"
        "import kubelet_dra.testing._eventually\n"
        "from kubelet_dra.kube.api import _error\n"
        "from kubelet_dra.testing import fakedriver\n"
        "fakedriver._unlink('x')\n"
        "plugins.PluginManager\n"
        "from kubelet_dra._proto.dra.v1 import api_pb2\n"
    )
    assert violations(sample, tree) == [
        "private module kubelet_dra.kubectl._model imported from outside kubelet_dra.kubectl",
        "private module kubelet_dra.testing._eventually imported from outside kubelet_dra.testing",
        "private name _error imported from kubelet_dra.kube.api",
        "private name fakedriver._unlink read from another module",
    ]
    # The same imports from a sibling of the private module are fine.
    sibling = PACKAGE / "kubectl" / "_cli.py"
    assert violations(sibling, ast.parse("from kubelet_dra.kubectl import _model\n")) == []

"""The reference pages under docs/reference are what docs/generate.py writes from the code.

A flag, a metric, an Event reason or a Helm value added without running the generator
leaves a page stale, and this test names it.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


GENERATE = _generator()


@pytest.mark.parametrize("name", sorted(GENERATE.PAGES))
def test_reference_page_is_current(name: str) -> None:
    path = ROOT / "docs" / "reference" / name
    assert path.read_text() == GENERATE.PAGES[name](), (
        f"docs/reference/{name} is stale: run python docs/generate.py"
    )


def test_every_run_flag_is_on_the_flags_page() -> None:
    from kubelet_dra import cli

    page = (ROOT / "docs" / "reference" / "flags.md").read_text()
    for flag, (_field, env, _text) in cli.RUN_FLAGS.items():
        assert f"| `{flag}`<br>`{env}` |" in page


@pytest.mark.parametrize("name", sorted(GENERATE.REGIONS))
def test_generated_region_is_current(name: str) -> None:
    path = ROOT / "docs" / name
    region, body = GENERATE.REGIONS[name]
    text = path.read_text()
    assert GENERATE.fill_region(text, region, body()) == text, (
        f"docs/{name}: the table from {region} is stale: run python docs/generate.py"
    )

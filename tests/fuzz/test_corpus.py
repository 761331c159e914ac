"""Every kept fuzz input replayed through its target's property (the default suite).

The seeds and the inputs the fuzzer found (``tests/fuzz/corpus/<target>``,
crashes and hangs among them once fixed) run here without atheris, so a
regression of any of them fails the default run. ~1 s.
"""

from __future__ import annotations

import importlib
import pathlib

import pytest

from tests.fuzz import _harness

TARGETS = ("fuzz_store", "fuzz_checkpoints", "fuzz_report", "fuzz_registration", "fuzz_patch")
CASES = [
    pytest.param(target, path, id=f"{target}/{path.name}")
    for target in TARGETS
    for path in sorted(_harness.corpus_dir(target).iterdir())
]


def test_every_target_has_seeds() -> None:
    for target in TARGETS:
        assert any(_harness.corpus_dir(target).iterdir()), target


@pytest.mark.parametrize(("target", "path"), CASES)
def test_corpus_input_keeps_its_property(target: str, path: pathlib.Path) -> None:
    module = importlib.import_module(f"tests.fuzz.{target}")
    module.test_one(path.read_bytes())

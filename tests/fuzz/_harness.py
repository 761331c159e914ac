"""The shared part of the atheris fuzz targets in ``tests/fuzz`` (no kubelet counterpart).

Each target module defines ``test_one(data: bytes) -> None``, which checks a
property and raises (``AssertionError`` or the unexpected exception) when it
does not hold, and ends with ``if __name__ == "__main__": main(test_one)``.
The same ``test_one`` replays the kept corpus in the default test suite
(``test_corpus.py``), without atheris.

:func:`instrumented` wraps a target's imports of ``kubelet_dra`` so that
atheris sees the package's branches (coverage-guided); outside a fuzzing run
it does nothing, so the default suite needs no atheris. This module imports
nothing of the package: whatever it imported first would not be instrumented.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import pathlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

CORPUS_ROOT = pathlib.Path(__file__).parent / "corpus"
DICT_ROOT = pathlib.Path(__file__).parent / "dicts"
# libFuzzer dictionaries: the tokens of each format (JSON, field names), so
# mutations reach past the parser; one -dict per run, so the files are joined.
DICTS = {
    "fuzz_store": ("json", "store"),
    "fuzz_checkpoints": ("json", "checkpoints"),
    "fuzz_patch": ("json", "patch"),
    "fuzz_registration": ("registration",),
}
# Deeper JSON than this is left out: every real reader of these inputs is
# behind a decoder with a depth limit far below Python's recursion limit.
MAX_JSON_DEPTH = 64


@contextlib.contextmanager
def instrumented(fuzzing: bool) -> Iterator[None]:
    """Instrument the ``kubelet_dra`` modules imported inside, when ``fuzzing``."""
    if not fuzzing:
        yield
        return
    import atheris

    with atheris.instrument_imports(include=["kubelet_dra"]):
        yield


def corpus_dir(target: str) -> pathlib.Path:
    """The kept seed corpus of ``target`` (a module name such as ``fuzz_store``)."""
    return CORPUS_ROOT / target.removeprefix("fuzz_")


def depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """The nesting depth of a decoded JSON value, counted up to ``limit + 1``."""
    stack = [(value, 1)]
    deepest = 0
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if level > limit:
            return level
        if isinstance(node, dict):
            stack.extend((v, level + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, level + 1) for v in node)
    return deepest


def main(test_one: Callable[[bytes], None], module_file: str) -> None:
    """Run ``test_one`` under atheris; extra arguments go to libFuzzer.

    ``--work DIR`` is where new inputs and crash files go (the kept seeds in
    ``corpus/<target>`` are read, never written).
    """
    import atheris

    # A fuzzer's inputs are mostly refused, and each refusal logs: the lines
    # would cost more than the input. The properties check the outcome.
    logging.disable(logging.CRITICAL)
    target = pathlib.Path(module_file).stem
    parser = argparse.ArgumentParser(prog=target)
    parser.add_argument("--work", type=pathlib.Path, required=True)
    ns, libfuzzer = parser.parse_known_args()
    work = ns.work / target
    (work / "corpus").mkdir(parents=True, exist_ok=True)
    names = DICTS.get(target, ())
    if names:
        joined = work / "tokens.dict"
        joined.write_text("".join((DICT_ROOT / f"{n}.dict").read_text() for n in names))
        libfuzzer.append(f"-dict={joined}")
    # libFuzzer's -merge=1 runs argv[0] again through the shell, joined with its flags:
    # name the interpreter and the module, as this file is not executable.
    again = f"{sys.executable} -m tests.fuzz.{target} --work {ns.work}"
    argv = [
        again if "-merge=1" in libfuzzer else sys.argv[0],
        *libfuzzer,
        f"-artifact_prefix={work}/",
        str(work / "corpus"),
        str(corpus_dir(target)),
    ]
    atheris.Setup(argv, _keeping_crashes(test_one, work))
    atheris.Fuzz()


def _keeping_crashes(
    test_one: Callable[[bytes], None], work: pathlib.Path
) -> Callable[[bytes], None]:
    # The atheris 3.0 wheel finds none of libFuzzer's crash hooks here
    # ("Failed to find function __sanitizer_acquire_crash_state"), so an
    # uncaught exception ends the run without libFuzzer writing the input:
    # write it ourselves, in libFuzzer's words so the runner finds it.
    def run(data: bytes) -> None:
        try:
            test_one(data)
        except BaseException:
            crash = work / f"crash-{hashlib.sha1(data).hexdigest()}"
            crash.write_bytes(data)
            print(f"Test unit written to {crash}", file=sys.stderr, flush=True)
            raise

    return run

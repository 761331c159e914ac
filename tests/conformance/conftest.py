"""Fixtures of the conformance suite: which kubelet lines run, and their twin binaries.

``KUBELET_DRA_CONFORMANCE_LINES`` (comma list, e.g. ``1.37,1.38``) selects lines; by
default every line runs. Twins are built before the test that needs them, outside its
timeout (a cold build takes minutes); without Go the test skips with the reason, a twin that
does not compile fails it (``_twin.require_binary``).
"""

from __future__ import annotations

import os

import pytest

from tests.conformance import _scenario as sc

LINES_ENV = "KUBELET_DRA_CONFORMANCE_LINES"
CONCURRENCY_ENV = "KUBELET_DRA_CONFORMANCE_CONCURRENCY"


def selected_lines() -> tuple[str, ...]:
    raw = os.environ.get(LINES_ENV, "")
    wanted = [line.strip() for line in raw.split(",") if line.strip()]
    unknown = [line for line in wanted if line not in sc.LINES]
    if unknown:
        raise pytest.UsageError(f"{LINES_ENV}: unknown lines {unknown} (known: {sc.LINES})")
    return tuple(wanted) or sc.LINES


def concurrency() -> int:
    return int(os.environ.get(CONCURRENCY_ENV, "24"))


@pytest.fixture
def twin_binary(line: str) -> str:
    """The twin of ``line`` (built on first use); skips without Go."""
    from tests.conformance import _suite, _twin

    if line not in selected_lines():
        pytest.skip(f"kubelet {line} not selected ({LINES_ENV})")
    return str(_twin.require_binary(_suite.version_of(line)))

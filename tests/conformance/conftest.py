"""Fixtures of the conformance suite: which kubelet lines run, and their twin binaries.

``KUBELET_DRA_CONFORMANCE_LINES`` (comma list, e.g. ``1.37,1.38``) selects lines; by
default every line runs. Twins are built before the test that needs them, outside its
timeout (a cold build takes minutes); without Go the test skips with the reason, a twin that
does not compile fails it (``_twin.require_binary``).

``go_helper`` (session): what scenarios with a Go helper driver need, the kube-apiserver of
``kube_apiserver_factory`` (``tests/conftest.py``, one per session, shared with the interop
tests) and the driver builds those scenarios use; skips with the reason without Go, openssl
or the module proxy, like the interop tests.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.conformance import _scenario as sc

if TYPE_CHECKING:
    from tests.conformance import _godriver

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


def _minor(line: str) -> str:
    """``1.37`` of a line given as a minor or as a version (``v1.37.2``)."""
    return ".".join(line.lstrip("v").split(".")[:2])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests of the lines not selected: a choice of the run, not a skip (under
    CI a skip fails the run, tests/_skipguard.py)."""
    wanted = set(selected_lines())
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        params = getattr(item, "callspec", None)
        line = params.params.get("line") if params is not None else None
        ours = isinstance(line, str) and "tests/conformance/" in item.nodeid
        (drop if ours and _minor(str(line)) not in wanted else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture
def twin_binary(line: str) -> str:
    """The twin of ``line`` (built on first use); skips without Go."""
    from tests.conformance import _suite, _twin

    if line not in selected_lines():
        pytest.skip(f"kubelet {line} not selected ({LINES_ENV})")
    return str(_twin.require_binary(_suite.version_of(line)))


@pytest.fixture(scope="session")
def go_helper(kube_apiserver_factory: Any) -> _godriver.GoHelperEnv:
    """The kube-apiserver and the Go driver builds of the selected Go helper scenarios."""
    from tests.conformance import _godriver
    from tests.interop import _build

    lines = selected_lines()
    used = {
        d.implementation
        for s in sc.load_all()
        if any(line in s.lines for line in lines)
        for d in s.drivers
        if d.go_helper
    }
    binaries: dict[str, Path] = {}
    for implementation in sorted(used):
        name = _godriver.BUILDS[implementation]
        try:
            binaries[implementation] = _build.ensure(name)
        except _build.BuildUnavailable as exc:
            pytest.skip(f"interop: {name} unavailable: {exc.reason}")
        except _build.BuildFailed as exc:
            pytest.fail(f"interop: building {name} failed: {exc}", pytrace=False)
    return _godriver.GoHelperEnv(kube_apiserver_factory(), binaries)

"""Fixtures for the real command-line tools of the deploy tests: ``helm`` and ``promtool``.

Both are built from the Go module proxy at pinned releases by ``tests/interop/_build.py``
(modules in ``tests/tools``) and cached by version. Builds run once, after collection and
before the first test (outside the per-test timeout), and only when a selected test uses
``helm_bin`` or ``promtool_bin``. Without Go (or without the module proxy) the tool found on
``PATH`` is used instead, if any (for promtool, for example Debian's ``prometheus`` package);
otherwise the tests that need it skip with the reason. A compile error fails them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.interop import _build

_TOOLS = {"helm_bin": "helm", "promtool_bin": "promtool"}
_OUTCOMES = pytest.StashKey[dict[str, Path | BaseException]]()


def _resolve(name: str) -> Path | BaseException:
    try:
        return _build.ensure(name)
    except _build.BuildUnavailable as exc:
        found = shutil.which(name)
        if found is not None:
            return Path(found)
        return exc
    except _build.BuildFailed as exc:
        return exc


def pytest_collection_finish(session: pytest.Session) -> None:
    outcomes: dict[str, Path | BaseException] = {}
    session.config.stash[_OUTCOMES] = outcomes
    if session.config.option.collectonly:
        return
    used: set[str] = set()
    for item in session.items:
        used.update(getattr(item, "fixturenames", ()))
    for fixture, name in _TOOLS.items():
        if fixture in used:
            outcomes[name] = _resolve(name)


def _tool(config: pytest.Config, name: str) -> Path:
    outcomes = config.stash.get(_OUTCOMES, {})
    outcome = outcomes.get(name)
    if outcome is None:
        outcome = outcomes[name] = _resolve(name)
    if isinstance(outcome, _build.BuildUnavailable):
        pytest.skip(f"{name} unavailable: {outcome.reason}; and no {name} on PATH")
    if isinstance(outcome, BaseException):
        pytest.fail(f"building {name} failed: {outcome}", pytrace=False)
    return outcome


@pytest.fixture(scope="session")
def helm_bin(pytestconfig: pytest.Config) -> Path:
    """The ``helm`` binary (v4.3.2 built from the module proxy, else ``helm`` on PATH)."""
    return _tool(pytestconfig, "helm")


@pytest.fixture(scope="session")
def promtool_bin(pytestconfig: pytest.Config) -> Path:
    """The ``promtool`` binary (Prometheus 3.16.0 from the module proxy, else on PATH)."""
    return _tool(pytestconfig, "promtool")

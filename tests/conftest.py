"""Fixtures shared by every test directory (one copy each; directory conftests add theirs).

- ``api``: a running :class:`~kubelet_dra.testing.FakeApiServer`, empty;
- ``sockdir``: a short temporary directory for unix sockets (paths are limited to
  107 bytes, so not pytest's long ``tmp_path``), removed after the test;
- ``registry``: ``<sockdir>/reg``, created, where drivers put registration sockets;
- ``fake_clock``: a :class:`~kubelet_dra.clock.FakeClock` for tests that move time
  themselves instead of sleeping;
- ``helm_bin``, ``promtool_bin`` (session): the real command-line tools of the deploy
  tests, built from the Go module proxy at pinned releases by ``tests/interop/_build.py``
  (modules in ``tests/tools``) and cached by version. Builds run once, after collection
  and before the first test (outside the per-test timeout), and only when a selected
  test uses them. Without Go (or without the module proxy) the tool found on ``PATH``
  is used instead, if any (for promtool, for example Debian's ``prometheus`` package);
  otherwise the tests that need it skip with the reason. A compile error fails them.

Helpers that are not fixtures live in modules with a leading underscore
(``tests/integration/_driver_fixtures.py``, ``_sidecar_process.py``, ...); waiting on
real time is :func:`kubelet_dra.testing.eventually`.
"""

from __future__ import annotations

import logging
import pathlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubelet_dra import clock
from kubelet_dra.testing import FakeApiServer
from tests.interop import _build


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """Undo what a test's ``cli.main`` did to the root logger.

    The command configures logging on the root logger with the ``sys.stderr`` of
    the moment, which pytest's capture closes after the test; a later test that
    logs would then print "--- Logging error ---" into its own captured output.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def sockdir() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="kd", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def registry(sockdir: pathlib.Path) -> pathlib.Path:
    path = sockdir / "reg"
    path.mkdir()
    return path


@pytest.fixture
def fake_clock() -> clock.FakeClock:
    return clock.FakeClock()


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

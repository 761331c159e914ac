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
- ``kube_apiserver_factory`` (session): ``factory(**kwargs) -> KubeApiServer``, a real
  etcd and kube-apiserver per distinct configuration (``tests/interop/_apiserver.py``),
  shared by every directory in the session (the interop tests and the conformance
  suite's Go helper scenarios); skips without Go, openssl or the module proxy.

Under ``CI``, a skip fails the run unless ``tests/allowed-skips.toml`` allows it
(``tests/_skipguard.py``): the hooks at the end of this file.

Helpers that are not fixtures live in modules with a leading underscore
(``tests/integration/_driver_fixtures.py``, ``_sidecar_process.py``, ...); waiting on
real time is :func:`kubelet_dra.testing.eventually`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubelet_dra import clock
from kubelet_dra.testing import FakeApiServer
from tests import _skipguard
from tests.interop import _build
from tests.interop._apiserver import (
    DEFAULT_FEATURE_GATES,
    KubeApiServer,
    openssl_unavailable_reason,
    start_kube_apiserver,
)


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


#: Fixture -> the tool it needs, built before the first test (tests/deploy/conftest.py
#: parametrizes ``helm_bin`` over Helm 4 and Helm 3 through ``helm_tool``).
_TOOLS = {
    "helm_bin": "helm",
    "helm_tool": "helm3",
    "promtool_bin": "promtool",
    "grafana_dashboard_check_bin": "grafana-dashboard-check",
    "validate_krew_manifest_bin": "validate-krew-manifest",
    "kubectl_bin": "kubectl",
}
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


def tool(config: pytest.Config, name: str) -> Path:
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
    return tool(pytestconfig, "helm")


@pytest.fixture(scope="session")
def promtool_bin(pytestconfig: pytest.Config) -> Path:
    """The ``promtool`` binary (Prometheus 3.16.0 from the module proxy, else on PATH)."""
    return tool(pytestconfig, "promtool")


@pytest.fixture(scope="session")
def grafana_dashboard_check_bin(pytestconfig: pytest.Config) -> Path:
    """Our checker of Grafana dashboards on Grafana's own dashboard types
    (tests/tools/grafana-dashboard, grafana-foundation-sdk v0.0.22)."""
    return tool(pytestconfig, "grafana-dashboard-check")


@pytest.fixture(scope="session")
def validate_krew_manifest_bin(pytestconfig: pytest.Config) -> Path:
    """krew's ``validate-krew-manifest`` (sigs.k8s.io/krew v0.4.3 from the module proxy)."""
    return tool(pytestconfig, "validate-krew-manifest")


@pytest.fixture(scope="session")
def kubectl_bin(pytestconfig: pytest.Config) -> Path:
    """``kubectl`` v1.37.2 (tests/tools/kubectl, from the module proxy), else on PATH."""
    return tool(pytestconfig, "kubectl")


def interop_binary(name: str) -> Path:
    """A ``tests/interop/_build.py`` artifact for a test: built (or taken from the cache),
    else the test skips (no Go, no module proxy) or fails (a compile error)."""
    try:
        return _build.ensure(name)
    except _build.BuildUnavailable as exc:
        pytest.skip(f"interop: {name} unavailable: {exc.reason}")
    except _build.BuildFailed as exc:
        pytest.fail(f"interop: building {name} failed: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def kube_apiserver_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., KubeApiServer]]:
    """Factory of running API servers, one per distinct configuration, shared by the session.

    Keyword arguments are those of ``_apiserver.start_kube_apiserver`` except the binaries
    and work directory. Do not change cluster-wide state that other tests rely on; use
    your own namespace.
    """
    servers: dict[str, KubeApiServer] = {}

    def get(**kwargs: Any) -> KubeApiServer:
        reason = openssl_unavailable_reason()
        if reason:
            pytest.skip(f"interop: {reason}")
        etcd_bin = interop_binary("etcd")
        apiserver_bin = interop_binary("kube-apiserver")
        kwargs.setdefault("feature_gates", DEFAULT_FEATURE_GATES)
        key = json.dumps(kwargs, sort_keys=True, default=list)
        server = servers.get(key)
        if server is None:
            workdir = tmp_path_factory.mktemp("kube-apiserver")
            server = start_kube_apiserver(
                etcd_bin=etcd_bin, apiserver_bin=apiserver_bin, workdir=workdir, **kwargs
            )
            servers[key] = server
        return server

    yield get
    for server in servers.values():
        with contextlib.suppress(Exception):
            server.stop()


# -- CI: no silent green (tests/_skipguard.py) ---------------------------------------

_GUARD = pytest.StashKey[_skipguard.Guard]()


def pytest_configure(config: pytest.Config) -> None:
    if _skipguard.ci_enabled():
        config.stash[_GUARD] = _skipguard.Guard(_skipguard.load())


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    guard = config.stash.get(_GUARD, None)
    if guard is not None:
        guard.collected(item.nodeid for item in items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    guard = item.config.stash.get(_GUARD, None)
    if guard is None or not report.skipped or hasattr(report, "wasxfail"):
        return report
    reason = _skipguard.skip_reason(report.longrepr)
    if guard.judge(item.nodeid, reason) is None:
        report.outcome = "failed"
        report.longrepr = _skipguard.failure_text(item.nodeid, reason)
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    guard = session.config.stash.get(_GUARD, None)
    # Only a run that passed says an entry is stale: one stopped early (-x) may not have
    # reached the skip it allows.
    if guard is None or exitstatus != pytest.ExitCode.OK:
        return
    stale = guard.stale()
    if stale:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(_skipguard.stale_text(stale), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

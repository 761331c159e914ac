"""Fixtures of the interop tests: real Go drivers built on the kubeletplugin helper and a
real kube-apiserver (with etcd), all built from the Go module proxy by ``_build``.

Builds happen once, after collection and before the first test (outside the per-test
timeout), for the artifacts the selected tests need. If Go or the module proxy is missing,
tests that need a binary are skipped with the reason; a compile error fails them.

Fixtures (see each docstring):

- ``interop_driver_bin`` (session): ``interop_driver_bin("current" | "v035") -> Path``.
- ``interop_driver`` (function): factory that starts :class:`DriverProcess` objects and
  stops them after the test, e.g. ``interop_driver("v035", script={...})``.
- ``interop_socket_dir`` (function): a short temporary directory for unix sockets.
- ``kube_apiserver_factory`` (session, defined in ``tests/conftest.py`` so that the
  conformance suite shares its servers): ``factory(feature_gates=..., runtime_config=...,
  extra_users=..., disable_admission_plugins=..., extra_args=...) -> KubeApiServer``;
  servers are shared per configuration within the session.
- ``kube_apiserver`` (function): the shared server for this test's configuration, taken
  from ``@pytest.mark.kube_apiserver(**kwargs)`` or indirect parametrization
  (``request.param`` is a dict of the same kwargs); default gates ResourceHealthStatus=true.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from . import _build
from ._apiserver import (
    KubeApiServer,
)
from ._driver import DEFAULT_DRIVER_NAME, DriverProcess

_OUTCOMES = pytest.StashKey[dict[str, Path | BaseException]]()

_DRIVER_FIXTURES = {"interop_driver_bin", "interop_driver"}
_APISERVER_FIXTURES = {"kube_apiserver", "kube_apiserver_factory", "own_apiserver"}
# The taint proofs (test_interop_taint_proofs.py) run the scheduler and controller manager.
_CONTROLLER_FIXTURES = {"control_plane"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kube_apiserver(**kwargs): configuration of the kube_apiserver fixture "
        "(feature_gates, runtime_config, extra_users, disable_admission_plugins, extra_args)",
    )


def _needed_artifacts(items: Sequence[pytest.Item]) -> list[str]:
    names: list[str] = []
    fixtures: set[str] = set()
    for item in items:
        fixtures.update(getattr(item, "fixturenames", ()))
    if fixtures & _DRIVER_FIXTURES:
        names += ["driver-current", "driver-v035"]
    if fixtures & _APISERVER_FIXTURES:
        names += ["etcd", "kube-apiserver"]
    if fixtures & _CONTROLLER_FIXTURES:
        names += ["kube-scheduler", "kube-controller-manager"]
    return names


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build what the selected tests need, one build at a time, before any test runs."""
    outcomes: dict[str, Path | BaseException] = {}
    session.config.stash[_OUTCOMES] = outcomes
    if session.config.option.collectonly:
        return
    for name in _needed_artifacts(session.items):
        try:
            outcomes[name] = _build.ensure(name)
        except (_build.BuildUnavailable, _build.BuildFailed) as exc:
            outcomes[name] = exc


def _artifact(config: pytest.Config, name: str) -> Path:
    outcomes = config.stash.get(_OUTCOMES, {})
    outcome = outcomes.get(name)
    if outcome is None:  # not pre-built (e.g. fixture requested dynamically): build now
        try:
            outcome = _build.ensure(name)
        except (_build.BuildUnavailable, _build.BuildFailed) as exc:
            outcome = exc
        outcomes[name] = outcome
    if isinstance(outcome, _build.BuildUnavailable):
        pytest.skip(f"interop: {name} unavailable: {outcome.reason}")
    if isinstance(outcome, BaseException):
        pytest.fail(f"interop: building {name} failed: {outcome}", pytrace=False)
    return outcome


@pytest.fixture(scope="session")
def interop_driver_bin(pytestconfig: pytest.Config) -> Callable[[str], Path]:
    """``interop_driver_bin(version) -> Path`` of a built driver binary.

    ``version`` is ``"current"`` (kubeletplugin v0.37.2: health v1 + v1alpha1 through the
    version-neutral hook) or ``"v035"`` (kubeletplugin v0.35.10: v1alpha1 implemented by the
    driver); the aliases in ``_build.DRIVER_ALIASES`` (e.g. ``"1.35"``) work too.
    """

    def get(version: str = "current") -> Path:
        if version not in _build.DRIVER_ALIASES:
            raise ValueError(f"unknown driver version {version!r}")
        return _artifact(pytestconfig, _build.DRIVER_ALIASES[version])

    return get


@pytest.fixture
def interop_socket_dir() -> Iterator[Path]:
    """A short temporary directory (unix socket paths are limited to ~107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="kdra-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


DriverFactory = Callable[..., DriverProcess]


@pytest.fixture
def interop_driver(
    interop_driver_bin: Callable[[str], Path], interop_socket_dir: Path, tmp_path: Path
) -> Iterator[DriverFactory]:
    """Factory: ``interop_driver(version="current", *, script=None, driver_name=...,
    registry_dir=None, plugin_data_dir=None, kubeconfig=None, extra_args=(), start=True)``.

    Defaults put the registration socket in ``<socket dir>/registry`` and the DRA socket in
    ``<socket dir>/plugins/<driver>/dra.sock``; pass ``registry_dir`` to point the driver at
    the directory a kubelet (ours) watches. Every driver started is stopped after the test.
    """
    started: list[DriverProcess] = []

    def start(
        version: str = "current",
        *,
        script: Mapping[str, Any] | None = None,
        driver_name: str = DEFAULT_DRIVER_NAME,
        registry_dir: Path | None = None,
        plugin_data_dir: Path | None = None,
        kubeconfig: Path | None = None,
        extra_args: Sequence[str] = (),
        start: bool = True,
    ) -> DriverProcess:
        binary = interop_driver_bin(version)
        index = len(started)
        driver = DriverProcess(
            binary,
            driver_name=driver_name,
            registry_dir=registry_dir or interop_socket_dir / "registry",
            plugin_data_dir=plugin_data_dir or interop_socket_dir / f"plugins{index}" / driver_name,
            control_file=tmp_path / f"control-{index}.json",
            log_dir=tmp_path,
            kubeconfig=kubeconfig,
            extra_args=extra_args,
        )
        started.append(driver)
        if start:
            driver.start(script)
        return driver

    yield start
    for driver in reversed(started):
        driver.stop()


ApiServerFactory = Callable[..., KubeApiServer]


@pytest.fixture
def kube_apiserver(
    request: pytest.FixtureRequest, kube_apiserver_factory: ApiServerFactory
) -> KubeApiServer:
    """The API server for this test: configured by ``request.param`` (indirect
    parametrization) or ``@pytest.mark.kube_apiserver(...)``, else the defaults."""
    kwargs: dict[str, Any] = {}
    marker = request.node.get_closest_marker("kube_apiserver")
    if marker is not None:
        kwargs.update(marker.kwargs)
    param = getattr(request, "param", None)
    if isinstance(param, Mapping):
        kwargs.update(param)
    return kube_apiserver_factory(**kwargs)

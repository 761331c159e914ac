"""Fixtures of the e2e tier: a real kubelet, our sidecar beside it, the real kube-apiserver.

Lines come from ``KUBELET_DRA_E2E_LINES`` (default ``1.37``; ``tox -e e2e`` runs
``1.35,1.37,1.38``). Binaries are built from the module proxy once per version and cached
like the interop binaries (``tests/interop/_build.py``); without Go, root or a private mount
namespace every test skips with the reason.

- ``e2e_server`` (session): kube-apiserver + etcd with an audit log of pod status writes,
  static-token users for every e2e node and for the sidecar.
- ``kubelet_on`` (session, per line and gate): ``kubelet_on(line, gate) -> Kubelet``, started
  and Ready; at most one kubelet runs at a time (the previous one is stopped).
- ``node_setup`` (function): a namespace, the driver registered with the kubelet, and a
  factory for our sidecar; everything is stopped after the test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import interop_binary
from tests.e2e import _api, _dra, _host, _node
from tests.interop import _build
from tests.interop._apiserver import KubeApiServer
from tests.interop._cluster import SidecarProcess
from tests.interop._driver import DriverProcess

LINES_ENV = "KUBELET_DRA_E2E_LINES"
SIDECAR_USER = "kubelet-dra-sidecar"


def e2e_lines() -> list[str]:
    raw = os.environ.get(LINES_ENV, "1.37")
    lines = [line.strip() for line in raw.split(",") if line.strip()]
    unknown = [line for line in lines if line not in _build.KUBELET_LINES]
    if unknown:
        raise pytest.UsageError(f"{LINES_ENV}: unknown kubelet lines {unknown}")
    return lines


def node_name(line: str, gate: bool) -> str:
    return f"e2e-{line.replace('.', '')}-{'on' if gate else 'off'}"


#: Seconds a test may take: a kubelet start, pods and a minute of watching fit in it (the
#: builds happen before the first test, outside it).
TEST_TIMEOUT = 420


def _ours(item: pytest.Item) -> bool:
    return "tests/e2e/" in str(item.path).replace(os.sep, "/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _ours(item):
            item.add_marker(pytest.mark.e2e)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(TEST_TIMEOUT))
    _deselect_other_lines(config, items)


def _deselect_other_lines(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.kubelet_lines("1.37", ...)``: the test is about a fact of those lines;
    on another it is deselected (a choice, not a skip: under CI a skip fails the run)."""
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        marker = item.get_closest_marker("kubelet_lines")
        callspec = getattr(item, "callspec", None)
        line = callspec.params.get("line") if callspec is not None else None
        (drop if marker and line is not None and line not in marker.args else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build what the selected e2e tests need before the first test (and its timeout)."""
    if session.config.option.collectonly or not any(_ours(i) for i in session.items):
        return
    names = ["etcd", "kube-apiserver", "driver-current", "fakecri"]
    names += [f"kubelet-{line}" for line in e2e_lines()]
    for name in names:
        # A failure is reported by the test that needs the binary (interop_binary).
        with contextlib.suppress(_build.BuildUnavailable, _build.BuildFailed):
            _build.ensure(name)


@pytest.fixture(scope="session")
def audit_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e-audit")


@pytest.fixture(scope="session")
def e2e_server(
    kube_apiserver_factory: Callable[..., KubeApiServer], audit_dir: Path
) -> KubeApiServer:
    reason = _node.unavailable_reason()
    if reason:
        pytest.skip(f"e2e: {reason}")
    users: dict[str, tuple[str, ...]] = {
        f"system:node:{node_name(line, gate)}": ("system:nodes",)
        for line in _build.KUBELET_LINES
        for gate in (True, False)
    }
    # The sidecar's own user, so that the audit log tells its writes from the kubelet's.
    # Least privilege is proven by the interop RBAC tests; here it is an admin.
    users[SIDECAR_USER] = ("system:masters",)
    return kube_apiserver_factory(extra_users=users, extra_args=_node.audit_args(audit_dir))


@pytest.fixture(scope="session")
def audit(e2e_server: KubeApiServer, audit_dir: Path) -> _node.Audit:
    return _node.Audit(audit_dir / "audit.log")


@pytest.fixture(scope="session")
def api(e2e_server: KubeApiServer) -> _api.Api:
    return _api.Api(e2e_server)


@pytest.fixture(scope="session")
def host_network(request: pytest.FixtureRequest) -> dict[str, str] | None:
    """The host's network before the session's first kubelet, when ``test_e2e_host.py`` is
    selected (Debian's iptables got first, so that every kubelet has one to run)."""
    if not any(item.path.name == "test_e2e_host.py" for item in request.session.items):
        return None
    try:
        _host.ensure_iptables()
    except _host.Unavailable as exc:
        pytest.skip(f"e2e: {exc}")
    return _host.state()


@pytest.fixture(scope="session")
def kubelet_on(
    e2e_server: KubeApiServer,
    tmp_path_factory: pytest.TempPathFactory,
    host_network: dict[str, str] | None,
) -> Iterator[Callable[[str, bool], _node.Kubelet]]:
    running: dict[tuple[str, bool], _node.Kubelet] = {}

    def get(line: str, gate: bool) -> _node.Kubelet:
        key = (line, gate)
        if key in running:
            return running[key]
        for other in list(running):
            running.pop(other).stop()
        kubelet = _node.Kubelet(
            kubelet_bin=interop_binary(f"kubelet-{line}"),
            fakecri_bin=interop_binary("fakecri"),
            server=e2e_server,
            workdir=Path(tempfile.mkdtemp(prefix=f"e2e-{line}-")),
            spec=_node.KubeletSpec(
                line=line,
                gates=_gates(line, gate),
                node=node_name(line, gate),
            ),
        )
        try:
            kubelet.start()
        except BaseException:
            kubelet.stop()  # a kubelet that never got Ready leaves no fake runtime behind
            raise
        running[key] = kubelet
        return kubelet

    yield get
    for kubelet in running.values():
        kubelet.stop()
        if not os.environ.get("KUBELET_DRA_E2E_KEEP"):  # keep the kubelet's logs to read
            shutil.rmtree(kubelet.workdir, ignore_errors=True)


#: Lines that know the ResourceHealthStatusMessage gate (added in 1.36; a kubelet refuses a
#: gate it does not know).
MESSAGE_GATE_LINES = frozenset({"1.37", "1.38"})
#: Lines whose kubelet finds a claim's name only in status.resourceClaimStatuses (set for
#: template claims): their pods use a ResourceClaimTemplate (``_dra.create_pod``).
TEMPLATE_LINES = frozenset({"1.35"})
#: Lines whose kubelet lists devices sharing a first CDI ID once each under that ID (no
#: deduplication before 1.36): the API server refuses its whole pod status patch.
DUPLICATE_ID_LINES = frozenset({"1.35"})


def _gates(line: str, on: bool) -> dict[str, bool]:
    gates = {"ResourceHealthStatus": on}
    if line in MESSAGE_GATE_LINES:
        # The message gate depends on the health gate: off together.
        gates["ResourceHealthStatusMessage"] = on
    return gates


@dataclasses.dataclass
class NodeSetup:
    """One test's world on a kubelet's node: namespace, driver, sidecar factory."""

    api: _api.Api
    server: KubeApiServer
    kubelet: _node.Kubelet
    driver: DriverProcess
    devices: _dra.Devices
    namespace: str
    workdir: Path
    sidecars: list[SidecarProcess] = dataclasses.field(default_factory=list)

    def flip(self, device: str, health: str, message: str = "") -> None:
        self.devices.set(device, health, message)
        _dra.apply(self.driver, self.devices)

    def create_pod(self, name: str, devices: list[str], restart: str = "Never") -> dict[str, Any]:
        return _dra.create_pod(
            self.api, namespace=self.namespace, name=name, node=self.kubelet.node,
            driver=self.driver.driver_name, devices=devices, restart=restart,
            template=self.kubelet.spec.line in TEMPLATE_LINES,
        )  # fmt: skip

    def pod(self, name: str) -> dict[str, Any]:
        return _dra.get_pod(self.api, self.namespace, name)

    def running(self, name: str, timeout: float = 60.0) -> dict[str, Any]:
        return _dra.wait(lambda: (p := self.pod(name)) and _dra.phase(p) == "Running" and p,
                         timeout, f"pod {name} Running")  # fmt: skip

    def sidecar(
        self,
        mode: str,
        *flags: str,
        state_dir: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> SidecarProcess:
        kubeconfig = self.server.write_kubeconfig(
            self.workdir / "sidecar.kubeconfig", self.server.tokens[SIDECAR_USER], SIDECAR_USER
        )
        process = SidecarProcess(
            node=self.kubelet.node, kubeconfig=kubeconfig, registry=self.kubelet.registry,
            state_dir=state_dir or self.workdir / "sidecar-state",
            flags=("--container-status", mode, *sidecar_flags(self.kubelet), *flags),
            env=env,
        )  # fmt: skip
        self.sidecars.append(process)
        return process.__enter__()


def sidecar_flags(kubelet: _node.Kubelet) -> tuple[str, ...]:
    """Flags that point the sidecar at this kubelet: the PodResources socket it serves."""
    return ("--pod-resources-socket", str(kubelet.root / "pod-resources" / "kubelet.sock"))


@pytest.fixture(params=e2e_lines(), ids=lambda line: f"kubelet-{line}")
def line(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture
def node_setup(
    request: pytest.FixtureRequest,
    line: str,
    kubelet_on: Callable[[str, bool], _node.Kubelet],
    api: _api.Api,
    e2e_server: KubeApiServer,
) -> Iterator[Callable[..., NodeSetup]]:
    made: list[NodeSetup] = []

    def setup(*, gate: bool, devices: list[_dra.Device] | None = None) -> NodeSetup:
        kubelet = kubelet_on(line, gate)
        namespace = f"t{len(made)}-{abs(hash(request.node.nodeid)) % 10**8}"
        _dra.ensure_namespace(api, namespace)
        _dra.ensure_device_class(api, _dra.DRIVER)
        workdir = Path(tempfile.mkdtemp(prefix="e2e-t-"))
        script = _dra.Devices(kubelet.node, devices or [_dra.Device("gpu-0")])
        driver = DriverProcess(
            interop_binary("driver-current"), driver_name=_dra.DRIVER,
            registry_dir=kubelet.registry, plugin_data_dir=kubelet.plugin_dir(_dra.DRIVER),
            control_file=workdir / "control.json", log_dir=workdir,
            kubeconfig=e2e_server.kubeconfig,
        )  # fmt: skip
        driver.start(script.script(_dra.DRIVER))
        world = NodeSetup(api, e2e_server, kubelet, driver, script, namespace, workdir)
        made.append(world)
        registered(driver)
        return world

    yield setup
    for world in made:
        for sidecar in world.sidecars:
            with contextlib.suppress(Exception):
                sidecar.stop()
        world.driver.stop()
        with contextlib.suppress(Exception):
            api.delete(f"/api/v1/namespaces/{world.namespace}")
        shutil.rmtree(world.workdir, ignore_errors=True)


def registered(driver: DriverProcess, timeout: float = 60.0) -> None:
    """Wait until the kubelet accepted the driver's registration."""
    driver.wait_for(
        "call",
        lambda e: str(e.get("method", "")).endswith("NotifyRegistrationStatus"),
        timeout=timeout,
    )

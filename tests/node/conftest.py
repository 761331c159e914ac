"""Fixtures of the node tier: containerd and runc run real pods beside the real kubelet.

``node_kubelet`` (session) starts the interop suite's kube-apiserver and etcd, then one
:class:`tests.node._node.NodeKubelet` (kubelet 1.37.2, the health gate on) on containerd
v2.4.2 and runc v1.5.3, with the pause and busybox images imported. ``node_controllers``
(session) adds the real kube-scheduler and kube-controller-manager 1.37.2 (the Job and
resourceclaim controllers); ``story`` (function) makes one test's device, driver, slice,
claim template and sidecar (tests/node/_story.py). Binaries and images are
built before the first test and cached (tests/interop/_build.py, tests/node/_images.py).

A host that cannot run it (not root, no private mount namespace, no overlayfs, no libseccomp
headers for runc, no Go or module proxy, no Debian package) skips every test with the reason;
under ``CI`` that skip is a failure (tests/_skipguard.py), as for every tier.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from tests.conftest import interop_binary
from tests.e2e import _api, _dra
from tests.e2e import _node as e2e_node
from tests.interop import _build
from tests.interop._apiserver import KubeApiServer
from tests.interop._cluster import SidecarProcess
from tests.interop._controlplane import Controllers, start_controllers
from tests.interop._driver import DriverProcess
from tests.node import _images, _node, _story

NODE = "node-137-on"
LINE = "1.37"
#: Seconds a test may take (the builds happen before the first test, outside it).
TEST_TIMEOUT = 420
SECCOMP_HEADER = Path("/usr/include/seccomp.h")
BUILDS = ("etcd", "kube-apiserver", f"kubelet-{LINE}", "containerd", "ctr",
          "containerd-shim-runc-v2", "runc", "node-pause", "driver-current",
          "kube-scheduler", "kube-controller-manager")  # fmt: skip


def unavailable(reason: str) -> NoReturn:
    """Skip with ``reason`` (under ``CI`` the root conftest's skip guard fails it)."""
    pytest.skip(f"node: {reason}")


def host_unavailable_reason() -> str | None:
    """Why this host cannot run containers for the tier, or None."""
    reason = e2e_node.unavailable_reason()
    if reason:
        return reason
    if shutil.which("nsenter") is None:
        return "the nsenter command is needed to start containerd and the kubelet"
    filesystems = Path("/proc/filesystems").read_text()
    if "overlay" not in filesystems.split():
        return "no overlay filesystem in /proc/filesystems (containerd's overlayfs snapshotter)"
    if not SECCOMP_HEADER.exists():
        return "no libseccomp headers to build runc with (apt-get install libseccomp-dev)"
    return None


def _ours(item: pytest.Item) -> bool:
    return "tests/node/" in str(item.path).replace(os.sep, "/")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _ours(item):
            item.add_marker(pytest.mark.node)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(TEST_TIMEOUT))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build what the tier needs before the first test (and its timeout)."""
    if session.config.option.collectonly or not any(_ours(i) for i in session.items):
        return
    for name in BUILDS:
        # A failure is reported by the test that needs the binary (interop_binary).
        with contextlib.suppress(_build.BuildUnavailable, _build.BuildFailed):
            _build.ensure(name)
    with contextlib.suppress(_images.ImageUnavailable):
        _images.ensure_images()


@pytest.fixture(scope="session")
def node_server(kube_apiserver_factory: Callable[..., KubeApiServer]) -> KubeApiServer:
    reason = host_unavailable_reason()
    if reason:
        unavailable(reason)
    users = {f"system:node:{NODE}": ("system:nodes",)}
    return kube_apiserver_factory(extra_users=users)


@pytest.fixture(scope="session")
def node_kubelet(node_server: KubeApiServer) -> Iterator[_node.NodeKubelet]:
    bins = _node.RuntimeBinaries(
        containerd=interop_binary("containerd"),
        ctr=interop_binary("ctr"),
        shim=interop_binary("containerd-shim-runc-v2"),
        runc=interop_binary("runc"),
    )
    try:
        images = _images.ensure_images()
    except _images.ImageUnavailable as exc:
        unavailable(exc.reason)
    kubelet = _node.NodeKubelet(
        kubelet_bin=interop_binary(f"kubelet-{LINE}"), bins=bins, images=images,
        server=node_server, workdir=Path(tempfile.mkdtemp(prefix="node-")),
        spec=e2e_node.KubeletSpec(line=LINE, gates=_gates(), node=NODE),
    )  # fmt: skip
    try:
        kubelet.start()
        yield kubelet
    finally:
        kubelet.stop()
        if not os.environ.get("KUBELET_DRA_E2E_KEEP"):  # keep the logs to read
            shutil.rmtree(kubelet.workdir, ignore_errors=True)


def _gates() -> dict[str, bool]:
    return {"ResourceHealthStatus": True, "ResourceHealthStatusMessage": True}


@pytest.fixture(scope="session")
def node_controllers(node_kubelet: _node.NodeKubelet) -> Iterator[Controllers]:
    """The real scheduler and Job/resourceclaim controllers on the node tier's API server."""
    # The kubelet registers its Node with the not-ready NoSchedule taint, which the node
    # lifecycle controller removes once the Node is Ready; that controller does not run here
    # (it would also taint and evict on a late heartbeat), so the fixture removes it.
    _api.Api(node_kubelet.server).patch(f"/api/v1/nodes/{node_kubelet.node}",
                                        {"spec": {"taints": None}})  # fmt: skip
    workdir = node_kubelet.workdir / "controllers"
    controllers = start_controllers(
        node_kubelet.server, scheduler_bin=interop_binary("kube-scheduler"),
        manager_bin=interop_binary("kube-controller-manager"), workdir=workdir,
    )  # fmt: skip
    try:
        yield controllers
    finally:
        controllers.stop()


@pytest.fixture
def story(
    node_kubelet: _node.NodeKubelet, node_controllers: Controllers
) -> Iterator[Callable[..., _story.Story]]:
    """``story(sidecar=True) -> Story``: a namespace with the device, its driver (registered),
    its slice and claim template, and our sidecar (unless ``sidecar=False``)."""
    made: list[_story.Story] = []

    def make(*, sidecar: bool = True) -> _story.Story:
        api = _api.Api(node_kubelet.server)
        namespace = f"story-{uuid.uuid4().hex[:6]}"
        _dra.ensure_namespace(api, namespace)
        _dra.ensure_device_class(api, _dra.DRIVER)
        workdir = Path(tempfile.mkdtemp(prefix="node-story-"))
        driver = DriverProcess(
            interop_binary("driver-current"), driver_name=_dra.DRIVER,
            registry_dir=node_kubelet.registry,
            plugin_data_dir=node_kubelet.plugin_dir(_dra.DRIVER),
            control_file=workdir / "control.json", log_dir=workdir,
            kubeconfig=node_kubelet.server.kubeconfig,
            extra_args=("--cdi-dir", str(node_kubelet.cdi_dir)),
        )  # fmt: skip
        world = _story.Story(api, node_kubelet, namespace, f"{node_kubelet.node}-{namespace}",
                             _story.StoryDevice(workdir), driver, workdir)  # fmt: skip
        made.append(world)
        driver.start(world.script())
        driver.wait_for(
            "call", lambda e: str(e.get("method", "")).endswith("NotifyRegistrationStatus"),
            timeout=60,
        )  # fmt: skip
        if sidecar:
            world.sidecar = SidecarProcess(
                node=node_kubelet.node, kubeconfig=node_kubelet.server.kubeconfig,
                registry=node_kubelet.registry, state_dir=workdir / "sidecar-state",
                flags=("--container-status", "auto", "--pod-resources-socket",
                       str(node_kubelet.root / "pod-resources" / "kubelet.sock")),
            ).__enter__()  # fmt: skip
        world.publish()
        return world

    yield make
    for world in made:
        world.cleanup()

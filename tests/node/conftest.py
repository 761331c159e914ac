"""Fixtures of the node tier: containerd and runc run real pods beside the real kubelet.

``node_kubelet`` (session) starts the interop suite's kube-apiserver and etcd, then one
:class:`tests.node._node.NodeKubelet` (kubelet 1.37.2, the health gate on) on containerd
v2.4.2 and runc v1.5.3, with the pause and busybox images imported. Binaries and images are
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from tests.conftest import interop_binary
from tests.e2e import _node as e2e_node
from tests.interop import _build
from tests.interop._apiserver import KubeApiServer
from tests.node import _images, _node

NODE = "node-137-on"
LINE = "1.37"
#: Seconds a test may take (the builds happen before the first test, outside it).
TEST_TIMEOUT = 420
SECCOMP_HEADER = Path("/usr/include/seccomp.h")
BUILDS = ("etcd", "kube-apiserver", f"kubelet-{LINE}", "containerd", "ctr",
          "containerd-shim-runc-v2", "runc", "node-pause")  # fmt: skip


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

"""A claimed device reaches the container: the driver's prepare writes a CDI spec, containerd
injects the device node, the workload opens it; unprepare removes the spec."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import interop_binary
from tests.e2e import _api, _dra
from tests.interop._driver import DriverProcess
from tests.node import _node

DEVICE = "gpu-0"


def make_device_node(directory: Path, name: str) -> Path:
    """A character device node of the test's own, with ``/dev/null``'s numbers."""
    null = os.stat("/dev/null")
    path = directory / name
    os.mknod(path, 0o666 | stat.S_IFCHR, null.st_rdev)
    return path


def script(node: str, device_path: Path, health: str = "HEALTHY") -> dict[str, Any]:
    return {
        "devices": [{"pool": node, "device": DEVICE, "health": health}],
        # No cdi_device_ids of its own: containerd refuses a CDI ID no spec defines.
        "prepare_devices": [{"pool": node, "device": DEVICE, "device_path": str(device_path)}],
        "resend_seconds": 5.0,
    }


@pytest.fixture
def cdi_driver(node_kubelet: _node.NodeKubelet) -> Iterator[tuple[DriverProcess, Path]]:
    workdir = Path(tempfile.mkdtemp(prefix="node-driver-"))
    device_path = make_device_node(workdir, DEVICE)
    driver = DriverProcess(
        interop_binary("driver-current"), driver_name=_dra.DRIVER,
        registry_dir=node_kubelet.registry, plugin_data_dir=node_kubelet.plugin_dir(_dra.DRIVER),
        control_file=workdir / "control.json", log_dir=workdir,
        kubeconfig=node_kubelet.server.kubeconfig,
        extra_args=("--cdi-dir", str(node_kubelet.cdi_dir)),
    )  # fmt: skip
    driver.start(script(node_kubelet.node, device_path))
    try:
        driver.wait_for(
            "call", lambda e: str(e.get("method", "")).endswith("NotifyRegistrationStatus"),
            timeout=60,
        )  # fmt: skip
        yield driver, device_path
    finally:
        driver.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_claimed_device_is_injected_by_cdi(
    node_kubelet: _node.NodeKubelet, cdi_driver: tuple[DriverProcess, Path]
) -> None:
    driver, _ = cdi_driver
    api = _api.Api(node_kubelet.server)
    namespace = f"cdi-{uuid.uuid4().hex[:6]}"
    _dra.ensure_namespace(api, namespace)
    _dra.ensure_device_class(api, _dra.DRIVER)
    workload = f"test -c /dev/{DEVICE} && : < /dev/{DEVICE} && echo opened && exit 0; exit 9"
    spec = {
        "hostNetwork": True, "automountServiceAccountToken": False,
        "containers": [{
            "name": _dra.CONTAINER, "image": node_kubelet.containerd.images[1].name,
            "imagePullPolicy": "Never", "command": ["sh", "-c", workload],
            "resources": {"claims": [{"name": "gpu"}]},
        }],
    }  # fmt: skip
    _dra.create_pod(api, namespace=namespace, name="cdi", node=node_kubelet.node,
                    driver=_dra.DRIVER, devices=[DEVICE], spec=spec)  # fmt: skip
    pod = _dra.wait(
        lambda: (p := _dra.get_pod(api, namespace, "cdi")) and _dra.phase(p) in
        ("Succeeded", "Failed") and p, 120, "the pod to finish",
    )  # fmt: skip
    statuses = pod["status"].get("containerStatuses") or [{}]
    assert _dra.phase(pod) == "Succeeded", statuses
    written = driver.find("cdi_spec_written")
    assert len(written) == 1, driver.events
    logs = sorted((node_kubelet.workdir / "pod-logs").glob(f"{namespace}_cdi_*/main/*.log"))
    assert logs and " stdout F opened" in logs[0].read_text()
    # The pod goes: the kubelet unprepares the claim and the spec goes with it.
    api.delete(f"/api/v1/namespaces/{namespace}/pods/cdi")
    driver.wait_for("cdi_spec_removed", timeout=90)
    assert not Path(str(written[0]["path"])).exists()
    assert list(node_kubelet.cdi_dir.iterdir()) == []

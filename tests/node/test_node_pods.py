"""A pod really runs on the node: containerd starts its process, its exit code reaches the API."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from tests.e2e import _api, _dra
from tests.node import _node


def busybox_pod(kubelet: _node.NodeKubelet, name: str, script: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeName": kubelet.node, "restartPolicy": "Never", "hostNetwork": True,
            "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": kubelet.containerd.images[1].name,
                            "imagePullPolicy": "Never", "command": ["sh", "-c", script]}],
        },
    }  # fmt: skip


def terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        state = (status.get("state") or {}).get("terminated")
        if state:
            return dict(state)
    return None


def test_exit_code_of_a_real_process(node_kubelet: _node.NodeKubelet) -> None:
    api = _api.Api(node_kubelet.server)
    namespace = f"pods-{uuid.uuid4().hex[:6]}"
    _dra.ensure_namespace(api, namespace)
    api.create(f"/api/v1/namespaces/{namespace}/pods",
               busybox_pod(node_kubelet, "exit7", "echo hi; exit 7"))  # fmt: skip
    pod = _dra.wait(
        lambda: (p := _dra.get_pod(api, namespace, "exit7")) and _dra.phase(p) == "Failed" and p,
        120,
        "the pod to fail",
    )
    state = terminated(pod)
    assert state is not None
    assert state["exitCode"] == 7, state
    assert _dra.phase(pod) == "Failed"
    # The output is the process's own, as containerd wrote it to the kubelet's log file.
    logs = sorted(Path(node_kubelet.workdir, "pod-logs").glob(f"{namespace}_exit7_*/main/*.log"))
    assert logs, "no container log file"
    assert " stdout F hi" in logs[0].read_text()
    # runc ran it: containerd has the container (exited, kept until the pod goes).
    assert state["containerID"].split("://", 1)[1] in node_kubelet.containerd.containers()

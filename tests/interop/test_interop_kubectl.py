"""Interop: ``kubectl dra-health`` against a real kube-apiserver 1.37.

Pods and claims are written as a kubelet and the scheduler would (``RealCluster``), with
device health in ``allocatedResourcesStatus`` and our condition; a resource.k8s.io/v1
DeviceTaintRule (GA and served by default in 1.37) taints one device (and, on a server whose
v1 does not serve DeviceTaintRules, a v1beta2 one: the fallback). The plugin runs as a
process with the admin kubeconfig and with a read-only service account (a ClusterRole of
get/list/watch), and must: resolve devices through the claims, show the rule's taint, page
through pods, follow a watch, and report 403s as one-line errors (exit 1) except for
DeviceTaintRules, whose denial only leaves the taints empty.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubelet_dra.testing.fakeapi import make_claim, make_pod

from ._apiserver import KubeApiServer
from ._cluster import RealCluster

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

DRIVER = "gpu.interop.example.com"
XID = "ECC uncorrectable error count exceeded (XID 48)"
READ_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"], "verbs": ["list"]},
]


@pytest.fixture
def cluster(kube_apiserver: KubeApiServer) -> Iterator[RealCluster]:
    real = RealCluster(kube_apiserver)
    yield real
    real.close()


def health_pod(
    name: str, namespace: str, node: str, claim: str, resources: list[dict[str, Any]], cond: str
) -> dict[str, Any]:
    pod = make_pod(name, node, namespace=namespace, claims=[claim])
    status = pod["status"]
    status["containerStatuses"][0]["allocatedResourcesStatus"] = [
        {"name": f"claim:{claim}", "resources": resources}
    ]
    status["conditions"].append(
        {
            "type": "DeviceHealthy",
            "status": cond,
            "reason": "DeviceUnhealthy" if cond == "False" else "AllDevicesHealthy",
            "message": "from the test",
            "lastTransitionTime": "2026-12-01T09:00:00Z",
        }
    )
    return pod


@pytest.fixture
def scenario(cluster: RealCluster) -> Iterator[tuple[str, str, str]]:
    """Namespace, node, DeviceTaintRule name: two pods, three devices, gpu-1 Unhealthy."""
    suffix = uuid.uuid4().hex[:8]
    namespace, node, pool = f"kubectl-{suffix}", f"node-{suffix}", f"pool-{suffix}"
    rid = lambda d: f"{DRIVER}/{pool}/{d}"  # noqa: E731
    for i, (devices, health) in enumerate(((["gpu-0", "gpu-1"], "False"), (["gpu-2"], "True"))):
        claim = f"claim-{i}"
        pod = cluster.create_pod(
            health_pod(
                f"train-{i}",
                namespace,
                node,
                claim,
                [
                    {
                        "resourceID": rid(d),
                        "health": "Unhealthy" if d == "gpu-1" else "Healthy",
                        **({"message": XID} if d == "gpu-1" else {}),
                    }
                    for d in devices
                ],
                health,
            )
        )
        cluster.create_claim(
            make_claim(
                claim,
                namespace,
                [(DRIVER, pool, d, "gpus") for d in devices],
                reserved_for=[pod],
                node=node,
            )
        )
    rule = f"kubectl-{suffix}"
    resource = client.ResourceV1Api(cluster.api)
    resource.create_device_taint_rule(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": rule},
            "spec": {
                "deviceSelector": {"driver": DRIVER, "pool": pool, "device": "gpu-1"},
                "taint": {"key": "example.com/xid", "value": "48", "effect": "NoSchedule"},
            },
        }
    )
    yield namespace, node, rule
    resource.delete_device_taint_rule(rule)


def plugin(kubeconfig: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubelet_dra.kubectl", "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_devices_resolve_through_claims_and_show_the_taint_rule(
    cluster: RealCluster, scenario: tuple[str, str, str]
) -> None:
    namespace, node, rule = scenario
    admin = cluster.server.kubeconfig
    proc = plugin(
        admin, "devices", "-n", namespace, "--all", "-o", "json", "--fail-on", "Unhealthy"
    )
    assert proc.returncode == 3, proc.stderr
    items = {i["device"]: i for i in json.loads(proc.stdout)["items"]}
    assert sorted(items) == ["gpu-0", "gpu-1", "gpu-2"]
    gpu1 = items["gpu-1"]
    assert gpu1["node"] == node and gpu1["driver"] == DRIVER and gpu1["health"] == "Unhealthy"
    assert gpu1["message"] == XID
    assert gpu1["pods"] == [
        {"namespace": namespace, "name": "train-0", "container": "main", "claim": "claim-0"}
    ]
    assert gpu1["taints"] == [
        {"key": "example.com/xid", "value": "48", "effect": "NoSchedule", "rule": rule}
    ]
    assert items["gpu-0"]["taints"] == []
    proc = plugin(admin, "devices", "--node", node, "-o", "wide")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and "example.com/xid=48:NoSchedule" in lines[1]
    proc = plugin(admin, "pods", "-n", namespace)
    assert proc.returncode == 0 and "False/DeviceUnhealthy" in proc.stdout
    proc = plugin(admin, "describe", "pod", "train-0", "-n", namespace)
    assert proc.returncode == 0, proc.stderr
    assert (
        "Condition:    DeviceHealthy=False (DeviceUnhealthy), since 2026-12-01T09:00:00Z"
        in proc.stdout
    )
    assert f"{DRIVER}/" in proc.stdout and XID in proc.stdout


def read_only_kubeconfig(cluster: RealCluster, tmp_path: Path, rules: list[dict[str, Any]]) -> Path:
    suffix = uuid.uuid4().hex[:8]
    namespace, account = f"viewer-{suffix}", "dra-health-viewer"
    token = cluster.server.service_account_token(namespace, account)
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    rbac.create_cluster_role({"metadata": {"name": f"dra-health-{suffix}"}, "rules": rules})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": f"dra-health-{suffix}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"dra-health-{suffix}",
            },
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        }
    )
    return cluster.server.write_kubeconfig(tmp_path / f"{suffix}.kubeconfig", token)


def test_read_only_rbac_is_enough_and_denials_are_one_line(
    cluster: RealCluster, scenario: tuple[str, str, str], tmp_path: Path
) -> None:
    namespace, _, _ = scenario
    viewer = read_only_kubeconfig(cluster, tmp_path, READ_RULES)
    proc = plugin(viewer, "devices", "-o", "json", "-n", namespace)
    assert proc.returncode == 0, proc.stderr
    items = json.loads(proc.stdout)["items"]
    assert items[0]["taints"][0]["key"] == "example.com/xid"
    no_taints = read_only_kubeconfig(cluster, tmp_path, READ_RULES[:3])
    proc = plugin(no_taints, "devices", "-o", "json", "-n", namespace)
    assert proc.returncode == 0, proc.stderr
    assert [i["taints"] for i in json.loads(proc.stdout)["items"]] == [[]]
    nothing = read_only_kubeconfig(cluster, tmp_path, READ_RULES[1:])
    proc = plugin(nothing, "devices")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: forbidden: ") and proc.stderr.count("\n") == 1
    assert 'cannot list resource "pods"' in proc.stderr


def test_watch_follows_a_status_change(
    cluster: RealCluster, scenario: tuple[str, str, str]
) -> None:
    namespace, _, _ = scenario
    cmd = [
        sys.executable,
        "-m",
        "kubelet_dra.kubectl",
        "--kubeconfig",
        str(cluster.server.kubeconfig),
        "devices",
        "-n",
        namespace,
        "-w",
        "--watch-max-redraws",
        "2",
        "--watch-seconds",
        "60",
    ]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        first = [proc.stdout.readline(), proc.stdout.readline()]
        assert "gpu-1" in first[1]
        # No wait for the watch to open: it starts from the list's resourceVersion, so a
        # change made before it opens still arrives.
        pod = cluster.get_pod(namespace, "train-1")
        cs = pod["status"]["containerStatuses"][0]
        cs["allocatedResourcesStatus"][0]["resources"][0].update(health="Unknown")
        cluster.patch_status(namespace, "train-1", {"status": {"containerStatuses": [cs]}})
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "gpu-2" in out and "Unknown" in out


@pytest.mark.kube_apiserver(
    runtime_config="resource.k8s.io/v1beta2=true,resource.k8s.io/v1/devicetaintrules=false"
)
def test_taints_come_from_v1beta2_when_v1_does_not_serve_them(
    kube_apiserver: KubeApiServer, tmp_path: Path
) -> None:
    cluster = RealCluster(kube_apiserver)
    try:
        suffix = uuid.uuid4().hex[:8]
        namespace, node, pool = f"beta-{suffix}", f"node-{suffix}", f"pool-{suffix}"
        resources = [{"resourceID": f"{DRIVER}/{pool}/gpu-0", "health": "Unknown"}]
        pod = cluster.create_pod(health_pod("p", namespace, node, "c", resources, "Unknown"))
        cluster.create_claim(
            make_claim(
                "c", namespace, [(DRIVER, pool, "gpu-0", "gpus")], reserved_for=[pod], node=node
            )
        )
        with pytest.raises(ApiException) as exc:  # the fallback is what this test is about
            client.ResourceV1Api(cluster.api).list_device_taint_rule()
        assert exc.value.status == 404
        beta = client.ResourceV1beta2Api(cluster.api)
        beta.create_device_taint_rule(
            {
                "apiVersion": "resource.k8s.io/v1beta2",
                "kind": "DeviceTaintRule",
                "metadata": {"name": f"beta-{suffix}"},
                "spec": {
                    "deviceSelector": {"pool": pool},
                    "taint": {"key": "maintenance", "effect": "NoSchedule"},
                },
            }
        )
        try:
            proc = plugin(kube_apiserver.kubeconfig, "devices", "-n", namespace, "-o", "json")
        finally:
            beta.delete_device_taint_rule(f"beta-{suffix}")
        assert proc.returncode == 0, proc.stderr
        taints = json.loads(proc.stdout)["items"][0]["taints"]
        assert taints == [
            {"key": "maintenance", "value": None, "effect": "NoSchedule", "rule": f"beta-{suffix}"}
        ]
    finally:
        cluster.close()

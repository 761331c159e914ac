"""Interop: the ValidatingAdmissionPolicy in ``deploy/`` on a real kube-apiserver 1.37.

The deployed objects (namespace's service account, ClusterRole, ClusterRoleBinding, policy and
binding) are created from ``deploy/`` with the admin client. A pod object for the sidecar
itself is created on a node so that a TokenRequest can be bound to it: with
ServiceAccountTokenPodNodeInfo (default on) such a token carries the node name in the extra
``authentication.kubernetes.io/node-name``, which the test checks with a SelfSubjectReview.
Then, as that token: a status write to a pod on another node is denied with the policy's
message, a write to a pod on its own node is admitted, and our sidecar with that token writes
its node's pods. A token not bound to a pod is denied for every pod.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubelet_dra.testing.fakeapi import PodClaim, make_claim, make_pod

from ._apiserver import KubeApiServer
from ._cluster import RealCluster, SidecarProcess, error_body, health_entries, poll
from ._driver import DriverProcess, device

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAMESPACE = ACCOUNT = "kubelet-dra-health"
DRIVER = "gpu.interop.example.com"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
DriverFactory = Callable[..., DriverProcess]


def load(name: str) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((DEPLOY / name).read_text())
    return obj


def create_ignoring_exists(create: Callable[[], Any]) -> None:
    try:
        create()
    except ApiException as exc:
        if exc.status != 409:
            raise


@pytest.fixture
def cluster(kube_apiserver: KubeApiServer) -> Iterator[RealCluster]:
    real = RealCluster(kube_apiserver)
    # The deployed service account, its RBAC and the policy (shared by the session's tests).
    kube_apiserver.service_account_token(NAMESPACE, ACCOUNT)
    rbac = client.RbacAuthorizationV1Api(real.api)
    admission = client.AdmissionregistrationV1Api(real.api)
    create_ignoring_exists(lambda: rbac.create_cluster_role(load("clusterrole.yaml")))
    create_ignoring_exists(
        lambda: rbac.create_cluster_role_binding(load("clusterrolebinding.yaml"))
    )
    create_ignoring_exists(
        lambda: admission.create_validating_admission_policy(load("validatingadmissionpolicy.yaml"))
    )
    create_ignoring_exists(
        lambda: admission.create_validating_admission_policy_binding(
            load("validatingadmissionpolicybinding.yaml")
        )
    )
    yield real
    real.close()


def node_bound_token(cluster: RealCluster, node: str) -> str:
    """A TokenRequest token bound to a (new) sidecar pod object on ``node``."""
    pod = cluster.create_pod(
        {
            "metadata": {"name": f"sidecar-{node}", "namespace": NAMESPACE},
            "spec": {
                "nodeName": node,
                "serviceAccountName": ACCOUNT,
                "containers": [{"name": "sidecar", "image": "registry.invalid/sidecar:1"}],
            },
        }
    )
    request = {
        "spec": {
            "audiences": [],
            "expirationSeconds": 3600,
            "boundObjectRef": {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            },
        }
    }
    answer = cluster.core.create_namespaced_service_account_token(ACCOUNT, NAMESPACE, request)
    return str(answer.status.token)


def who_am_i(cluster: RealCluster, token: str) -> dict[str, Any]:
    with cluster.server.api_client(token) as api:
        review = client.AuthenticationV1Api(api).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        )
        info: dict[str, Any] = api.sanitize_for_serialization(review.status.user_info)
        return info


def write_condition(
    cluster: RealCluster, token: str, namespace: str, pod: str
) -> tuple[int, dict[str, Any]]:
    """PATCH a condition into the pod's status as ``token``: HTTP status and error body."""
    body = {
        "status": {
            "conditions": [
                {"type": "DeviceHealthy", "status": "True", "reason": "AllDevicesHealthy"}
            ]
        }
    }
    with cluster.server.api_client(token) as api:
        try:
            client.CoreV1Api(api).patch_namespaced_pod_status(pod, namespace, body)
        except ApiException as exc:
            return int(exc.status), error_body(exc)
    return 200, {}


def workloads(cluster: RealCluster, own: str, other: str) -> str:
    namespace = f"vap-{uuid.uuid4().hex[:8]}"
    for name, node in (("on-own-node", own), ("on-other-node", other)):
        pod = cluster.create_pod(
            make_pod(name, node, namespace=namespace, claims=[PodClaim("gpu", f"{name}-gpu")])
        )
        cluster.create_claim(
            make_claim(
                f"{name}-gpu", namespace, [(DRIVER, "pool-0", f"gpu-{name}", "gpu")],
                reserved_for=[pod], node=node,
            )
        )  # fmt: skip
    return namespace


def test_node_bound_token_carries_node_name(cluster: RealCluster) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    info = who_am_i(cluster, node_bound_token(cluster, node))
    assert info["username"] == f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
    assert info["extra"][NODE_NAME_EXTRA] == [node]
    unbound = who_am_i(cluster, cluster.server.service_account_token(NAMESPACE, ACCOUNT))
    assert NODE_NAME_EXTRA not in (unbound.get("extra") or {})


def test_policy_limits_writes_to_own_node(cluster: RealCluster) -> None:
    own, other = f"node-{uuid.uuid4().hex[:8]}", f"node-{uuid.uuid4().hex[:8]}"
    namespace = workloads(cluster, own, other)
    token = node_bound_token(cluster, own)
    # The policy takes effect once the API server's policy informer has seen it.
    _, denied = poll(
        lambda: (r := write_condition(cluster, token, namespace, "on-other-node"))[0] == 403 and r,
        15,
        "the policy to deny a write to another node's pod",
    )
    assert denied["reason"] == "Forbidden"
    assert (
        f'kubelet-dra-health on node "{own}" may write the status only of pods on its own '
        f'node; pod {namespace}/on-other-node is on node "{other}"'
    ) in denied["message"]
    assert "ValidatingAdmissionPolicy 'kubelet-dra-health-own-node'" in denied["message"]
    assert write_condition(cluster, token, namespace, "on-own-node") == (200, {})
    # A token without the node claim may write nothing at all.
    unbound = cluster.server.service_account_token(NAMESPACE, ACCOUNT)
    code, body = write_condition(cluster, unbound, namespace, "on-own-node")
    assert code == 403
    assert "node-bound service-account token" in body["message"]


def test_sidecar_with_node_bound_token(
    cluster: RealCluster,
    interop_driver: DriverFactory,
    interop_socket_dir: Path,
    tmp_path: Path,
) -> None:
    own, other = f"node-{uuid.uuid4().hex[:8]}", f"node-{uuid.uuid4().hex[:8]}"
    namespace = workloads(cluster, own, other)
    token = node_bound_token(cluster, own)
    poll(
        lambda: write_condition(cluster, token, namespace, "on-other-node")[0] == 403,
        15,
        "the policy in effect",
    )
    driver = interop_driver(
        "current", driver_name=DRIVER, registry_dir=interop_socket_dir / "registry",
        script={"devices": [device("gpu-on-own-node", "UNHEALTHY"), device("gpu-on-other-node")]},
    )  # fmt: skip
    kubeconfig = cluster.server.write_kubeconfig(tmp_path / "bound.kubeconfig", token)
    with SidecarProcess(
        node=own, kubeconfig=kubeconfig, registry=driver.registry_dir,
        state_dir=tmp_path / "state",
    ) as sidecar:  # fmt: skip
        sidecar.until(
            lambda: "Unhealthy" in str(health_entries(cluster.get_pod(namespace, "on-own-node"))),
            what="the own node's pod written",
        )
        assert not sidecar.grep("HTTP 403|not written")
    assert health_entries(cluster.get_pod(namespace, "on-other-node")) == {}

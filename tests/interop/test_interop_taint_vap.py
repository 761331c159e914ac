"""Interop: the taint bridge's RBAC and admission policy in ``deploy/`` on a real kube-apiserver.

As in ``test_interop_vap.py``: the deployed ClusterRole, binding and both policies are
created from ``deploy/``, and a TokenRequest token is bound to a sidecar pod object on a node
(so it carries ``authentication.kubernetes.io/node-name``). As that token, DeviceTaintRules
labelled with its own node can be created, updated and deleted; rules for another node, or
without our labels, cannot; a token without the node claim can write none; and the verbs
the bridge does not use are denied by RBAC. Then the sidecar itself, with that token and
``--taint-effect NoSchedule``, creates its rule on the real server.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubelet_dra.status.podjson import MutableObj as Obj

from ._apiserver import KubeApiServer
from ._cluster import RealCluster, SidecarProcess
from ._driver import DriverProcess, device
from .test_interop_vap import create_ignoring_exists, load, node_bound_token

pytestmark = [pytest.mark.interop, pytest.mark.timeout(180)]

DRIVER = "gpu.interop.example.com"
DriverFactory = Callable[..., DriverProcess]


@pytest.fixture
def cluster(kube_apiserver: KubeApiServer) -> Iterator[RealCluster]:
    real = RealCluster(kube_apiserver)
    kube_apiserver.service_account_token("kubelet-dra-health", "kubelet-dra-health")
    rbac = client.RbacAuthorizationV1Api(real.api)
    admission = client.AdmissionregistrationV1Api(real.api)
    create_ignoring_exists(lambda: rbac.create_cluster_role(load("clusterrole.yaml")))
    create_ignoring_exists(
        lambda: rbac.create_cluster_role_binding(load("clusterrolebinding.yaml"))
    )
    for policy in ("validatingadmissionpolicy", "validatingadmissionpolicy-taints"):
        create_ignoring_exists(
            functools.partial(admission.create_validating_admission_policy, load(f"{policy}.yaml"))
        )
    for binding in ("validatingadmissionpolicybinding", "validatingadmissionpolicybinding-taints"):
        create_ignoring_exists(
            functools.partial(
                admission.create_validating_admission_policy_binding, load(f"{binding}.yaml")
            )
        )
    yield real
    real.close()


def rule(name: str, node: str | None, managed: bool = True) -> Obj:
    labels = {}
    if node is not None:
        labels["kubelet-dra.io/node"] = node
    if managed:
        labels["app.kubernetes.io/managed-by"] = "kubelet-dra-health"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": node or "pool", "device": "gpu-0"},
            "taint": {"key": "kubelet-dra.io/unhealthy", "value": "Unhealthy", "effect": "None"},
        },
    }


def as_token(
    cluster: RealCluster, token: str, call: Callable[[client.ResourceV1Api], Any]
) -> tuple[int, str]:
    with cluster.server.api_client(token) as api:
        try:
            call(client.ResourceV1Api(api))
        except ApiException as exc:
            return int(exc.status), str(json.loads(exc.body or "{}").get("message", ""))
    return 200, ""


def test_policy_limits_rules_to_own_node(cluster: RealCluster) -> None:
    own, other = f"node-{uuid.uuid4().hex[:8]}", f"node-{uuid.uuid4().hex[:8]}"
    token = node_bound_token(cluster, own)
    admin = cluster.resource
    # Rules that are not ours: another node's, and an administrator's own.
    admin.create_device_taint_rule(rule(f"{other}-x", other))
    admin.create_device_taint_rule(rule(f"{own}-admin", None, managed=False))

    def create(body: Obj) -> Callable[[client.ResourceV1Api], Any]:
        return lambda api: api.create_device_taint_rule(body)

    # The policy takes effect once the API server's policy informer has seen it.
    code, message = (0, "")
    for _ in range(150):
        code, message = as_token(cluster, token, create(rule(f"{own}-for-other", other)))
        if code == 403:
            break
        if code == 201 or code == 200:  # admitted before the policy was active: undo
            admin.delete_device_taint_rule(f"{own}-for-other")
        time.sleep(0.1)
    assert code == 403, message
    assert (
        f'kubelet-dra-health on node "{own}" may write only DeviceTaintRules labelled '
        f"kubelet-dra.io/node={own}"
    ) in message
    assert "ValidatingAdmissionPolicy 'kubelet-dra-health-own-node-taints'" in message
    # Our own: create, list by label, update, delete.
    assert as_token(cluster, token, create(rule(f"{own}-gpu-0", own))) == (200, "")
    code, _ = as_token(
        cluster,
        token,
        lambda api: api.list_device_taint_rule(label_selector=f"kubelet-dra.io/node={own}"),
    )
    assert code == 200
    current = admin.read_device_taint_rule(f"{own}-gpu-0")
    current.spec.taint.effect = "NoSchedule"
    assert as_token(
        cluster, token, lambda api: api.replace_device_taint_rule(f"{own}-gpu-0", current)
    ) == (200, "")
    # Unlabelled or other node: no create, update or delete.
    assert as_token(cluster, token, create(rule(f"{own}-bare", own, managed=False)))[0] == 403
    theirs = admin.read_device_taint_rule(f"{other}-x")
    theirs.metadata.labels["kubelet-dra.io/node"] = own
    code, _ = as_token(
        cluster, token, lambda api: api.replace_device_taint_rule(f"{other}-x", theirs)
    )
    assert code == 403
    for name in (f"{other}-x", f"{own}-admin"):
        code, message = as_token(
            cluster,
            token,
            lambda api: api.delete_device_taint_rule(name),  # noqa: B023
        )
        assert code == 403, name
        assert "may change or delete only DeviceTaintRules labelled with its own node" in message
    assert as_token(cluster, token, lambda api: api.delete_device_taint_rule(f"{own}-gpu-0")) == (
        200,
        "",
    )
    # RBAC: the verbs the bridge does not use are not granted.
    assert as_token(cluster, token, lambda api: api.read_device_taint_rule(f"{other}-x"))[0] == 403
    assert (
        as_token(
            cluster,
            token,
            lambda api: api.patch_device_taint_rule(f"{own}-admin", {"metadata": {"labels": {}}}),
        )[0]
        == 403
    )
    # A token without the node claim may write no rule at all.
    unbound = cluster.server.service_account_token("kubelet-dra-health", "kubelet-dra-health")
    code, message = as_token(cluster, unbound, create(rule(f"{own}-unbound", own)))
    assert code == 403
    assert "node-bound service-account token" in message


def test_sidecar_creates_its_rule_with_a_node_bound_token(
    cluster: RealCluster,
    interop_driver: DriverFactory,
    interop_socket_dir: Path,
    tmp_path: Path,
) -> None:
    own = f"node-{uuid.uuid4().hex[:8]}"
    token = node_bound_token(cluster, own)
    driver = interop_driver(
        "current", driver_name=DRIVER, registry_dir=interop_socket_dir / "registry",
        script={"devices": [device("gpu-0", "UNHEALTHY", pool=own, message="XID 79")],
                "resend_seconds": 2},
    )  # fmt: skip
    kubeconfig = cluster.server.write_kubeconfig(tmp_path / "bound.kubeconfig", token)
    selector = f"kubelet-dra.io/node={own}"
    with SidecarProcess(
        node=own, kubeconfig=kubeconfig, registry=driver.registry_dir,
        state_dir=tmp_path / "state", flags=("--taint-effect", "NoSchedule", "--taint-after", "0"),
    ) as sidecar:  # fmt: skip
        rules = sidecar.until(
            lambda: cluster.resource.list_device_taint_rule(label_selector=selector).items,
            timeout=60,
            what="the sidecar's DeviceTaintRule",
        )
        assert not sidecar.grep("taint bridge off|HTTP 403")
    (made,) = rules
    assert made.metadata.name == f"{own}.{DRIVER}.{own}.gpu-0"
    assert made.spec.device_selector.device == "gpu-0"
    assert (made.spec.taint.key, made.spec.taint.value, made.spec.taint.effect) == (
        "kubelet-dra.io/unhealthy",
        "Unhealthy",
        "NoSchedule",
    )
    assert made.metadata.annotations["kubelet-dra.io/message"] == "XID 79"

"""Interop: the ClusterRole in ``deploy/`` is exactly enough for the sidecar, on a real
kube-apiserver 1.37 with ``--authorization-mode=Node,RBAC``.

A service account gets a copy of ``deploy/clusterrole.yaml`` through a ClusterRoleBinding
(created with the admin client), and a TokenRequest token (not bound to a pod: the
ValidatingAdmissionPolicy only matches the deployed service account's name, tested in
``test_interop_vap.py``). The sidecar runs a full scenario with that token: it lists and
watches the node's pods, reads the claims, writes pod status, posts a DeviceUnhealthy
Event and (taint bridge on) creates a DeviceTaintRule, then deletes it when the device
recovers. Then each verb of the ClusterRole that scenario uses is removed in turn: the
sidecar must log the 403 it meets. The verbs it cannot reach are listed in
``NOT_EXERCISED`` with the reason.
"""

from __future__ import annotations

import copy
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kubelet_dra.testing.fakeapi import PodClaim, make_claim, make_pod

from ._apiserver import KubeApiServer
from ._cluster import RealCluster, SidecarProcess, condition, health_entries
from ._driver import DriverProcess, device

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DRIVER = "gpu.interop.example.com"
DriverFactory = Callable[..., DriverProcess]


def cluster_role() -> dict[str, Any]:
    role: dict[str, Any] = yaml.safe_load((DEPLOY / "clusterrole.yaml").read_text())
    return role


def rule_id(rule: dict[str, Any]) -> str:
    group = rule["apiGroups"][0] or "core"
    return f"{group}:{'+'.join(rule['resources'])}"


RULES = cluster_role()["rules"]


@pytest.fixture
def cluster(kube_apiserver: KubeApiServer) -> Iterator[RealCluster]:
    real = RealCluster(kube_apiserver)
    yield real
    real.close()


def bind_role(
    cluster: RealCluster, rules: list[dict[str, Any]], namespace: str, account: str
) -> str:
    """ClusterRole (the deployed one with ``rules``) + binding to ``namespace/account``;
    returns a TokenRequest token of the account."""
    token = cluster.server.service_account_token(namespace, account)
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    role = copy.deepcopy(cluster_role())
    role["metadata"]["name"] = f"kubelet-dra-health-{namespace}"
    role["rules"] = rules
    rbac.create_cluster_role(role)
    binding: dict[str, Any] = yaml.safe_load((DEPLOY / "clusterrolebinding.yaml").read_text())
    binding["metadata"]["name"] = role["metadata"]["name"]
    binding["roleRef"]["name"] = role["metadata"]["name"]
    binding["subjects"] = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    rbac.create_cluster_role_binding(binding)
    return token


def run_scenario(
    cluster: RealCluster,
    driver: DriverProcess,
    tmp_path: Path,
    rules: list[dict[str, Any]],
) -> tuple[SidecarProcess, str, str]:
    """Start the sidecar with a token bound to ``rules`` and one pod with an unhealthy
    device on its node. Returns the running sidecar, the namespace and the node."""
    suffix = uuid.uuid4().hex[:8]
    namespace, node = f"rbac-{suffix}", f"node-{suffix}"
    token = bind_role(cluster, rules, namespace, "kubelet-dra-health")
    pod = cluster.create_pod(
        make_pod("workload", node, namespace=namespace, claims=[PodClaim("gpu", "gpu-claim")])
    )
    cluster.create_claim(
        make_claim(
            "gpu-claim", namespace, [(DRIVER, "pool-0", "gpu-0", "gpu")],
            reserved_for=[pod], node=node,
        )
    )  # fmt: skip
    kubeconfig = cluster.server.write_kubeconfig(tmp_path / "sa.kubeconfig", token)
    # The taint bridge on (effect None: it marks, nothing acts on it), so that its
    # devicetaintrules rule is exercised too.
    sidecar = SidecarProcess(
        node=node, kubeconfig=kubeconfig, registry=driver.registry_dir,
        state_dir=tmp_path / "state",
        flags=("--taint-effect", "None", "--taint-after", "0", "--untaint-after", "0"),
    )  # fmt: skip
    return sidecar, namespace, node


@pytest.fixture
def driver(interop_driver: DriverFactory, interop_socket_dir: Path) -> DriverProcess:
    return interop_driver(
        "current", driver_name=DRIVER, registry_dir=interop_socket_dir / "registry",
        script={"devices": [device("gpu-0", "UNHEALTHY", message="ECC")]},
    )  # fmt: skip


def scenario_done(cluster: RealCluster, namespace: str) -> bool:
    pod = cluster.get_pod(namespace, "workload")
    written = "Unhealthy" in str(health_entries(pod)) and condition(pod, "DeviceHealthy")
    events = [e for e in cluster.events(namespace) if e.get("reason") == "DeviceUnhealthy"]
    node = namespace.replace("rbac-", "node-", 1)
    tainted = cluster.resource.list_device_taint_rule(
        label_selector=f"kubelet-dra.io/node={node}"
    ).items
    return bool(written and events and tainted)


def test_deployed_rules_run_a_full_scenario(
    cluster: RealCluster, driver: DriverProcess, tmp_path: Path
) -> None:
    sidecar, namespace, _ = run_scenario(cluster, driver, tmp_path, RULES)
    with sidecar:
        sidecar.until(lambda: scenario_done(cluster, namespace), what="status and event")
        assert not sidecar.grep("403|[Ff]orbidden")
        readyz = sidecar.metrics_url().replace("/metrics", "/readyz")
        with urllib.request.urlopen(readyz, timeout=5) as answer:
            assert answer.status == 200
        # Recovery: the taint rule is deleted (and a DeviceHealthy Event created).
        driver.control({"devices": [device("gpu-0", "HEALTHY")]})
        sidecar.until(lambda: recovered(cluster, namespace), what="recovery")
        assert not sidecar.grep("403|[Ff]orbidden")


def recovered(cluster: RealCluster, namespace: str) -> bool:
    """After the device turned Healthy: the pod says so and the taint rule is deleted."""
    pod = cluster.get_pod(namespace, "workload")
    node = namespace.replace("rbac-", "node-", 1)
    tainted = cluster.resource.list_device_taint_rule(
        label_selector=f"kubelet-dra.io/node={node}"
    ).items
    return "Unhealthy" not in str(health_entries(pod)) and not tainted


def verb_params() -> Iterator[Any]:
    for i, rule in enumerate(RULES):
        for verb in rule["verbs"]:
            key = f"{rule_id(rule)}:{verb}"
            if key not in NOT_EXERCISED:
                yield pytest.param(i, verb, id=key)


#: Verbs of the ClusterRole this scenario cannot make the code use, and why. They are
#: proven against the code's recorded requests only (tests/unit/test_deploy.py).
NOT_EXERCISED = {
    "core:pods/status:get": "the status is re-read only after a conflict",
    "core:events:patch": "an Event is patched only when its series repeats in an interval",
    "resource.k8s.io:devicetaintrules:update": "a rule changes only with its taint's value",
}


def test_every_verb_is_exercised_or_listed() -> None:
    verbs = {f"{rule_id(r)}:{v}" for r in RULES for v in r["verbs"]}
    assert set(NOT_EXERCISED) <= verbs
    assert len(list(verb_params())) + len(NOT_EXERCISED) == len(verbs)


@pytest.mark.parametrize(("removed", "verb"), list(verb_params()))
def test_each_verb_is_needed(
    cluster: RealCluster, driver: DriverProcess, tmp_path: Path, removed: int, verb: str
) -> None:
    rules = copy.deepcopy(RULES)
    rules[removed]["verbs"].remove(verb)
    rules = [r for r in rules if r["verbs"]]
    sidecar, namespace, _ = run_scenario(cluster, driver, tmp_path, rules)
    with sidecar:
        if verb == "delete":
            # A taint rule is deleted when its device recovers: first the taint.
            sidecar.until(lambda: scenario_done(cluster, namespace), what="status and event")
            driver.control({"devices": [device("gpu-0", "HEALTHY")]})
        # The code used the verb: the server refused it, and the sidecar says so.
        sidecar.until(lambda: sidecar.grep("HTTP 403"), timeout=20, what="a 403")

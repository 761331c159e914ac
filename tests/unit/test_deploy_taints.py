"""The ValidatingAdmissionPolicy of the taint bridge in ``deploy/``, evaluated with cel-python.

Like the pod-status policy in ``test_deploy.py`` (whose evaluator this reuses): a node's
token may create, change and delete only DeviceTaintRules labelled with its own node and
managed by kubelet-dra-health; other users are not matched. ``tests/interop`` runs the same
policy on a real kube-apiserver.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubelet_dra.status.podjson import MutableObj as Obj
from tests.unit import test_deploy as deploy

needs_cel = deploy.needs_cel
POLICY = "kubelet-dra-health-own-node-taints"


@pytest.fixture(scope="module")
def vap() -> Obj:
    return deploy._named("ValidatingAdmissionPolicy", POLICY)


def rule(node: str | None, *, managed: bool = True, name: str = "r1") -> Obj:
    labels: dict[str, str] = {}
    if node is not None:
        labels["kubelet-dra.io/node"] = node
    if managed:
        labels["app.kubernetes.io/managed-by"] = "kubelet-dra-health"
    meta: Obj = {"name": name}
    if labels:
        meta["labels"] = labels
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": meta,
        "spec": {
            "deviceSelector": {"driver": "gpu.example.com", "pool": "p", "device": "gpu-0"},
            "taint": {"key": "kubelet-dra.io/unhealthy", "value": "Unhealthy", "effect": "None"},
        },
    }


def request(operation: str, username: str = deploy.SA_USERNAME, node: str | None = "node-a") -> Obj:
    extra = deploy._token_extra(node)
    return {
        "uid": "r-1",
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "DeviceTaintRule"},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "devicetaintrules"},
        "name": "r1",
        "operation": operation,
        "userInfo": {"username": username, "uid": "u", "groups": [], "extra": extra},
    }


def evaluate(vap: Obj, operation: str, new: Obj | None, old: Obj | None, **kw: Any) -> Any:
    # _evaluate is typed for UPDATE (both objects); CREATE and DELETE pass None for one.
    return deploy._evaluate(vap, request(operation, **kw), new, old)  # type: ignore[arg-type]


def test_policy_matches_devicetaintrule_writes(vap: Obj) -> None:
    spec = vap["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": ["devicetaintrules"],
        }
    ]
    writes = {
        v for g, r, v in deploy.REQUIRED_RULES if (g, r) == ("resource.k8s.io", "devicetaintrules")
    }
    # Every write verb the ClusterRole grants is an operation the policy checks.
    assert writes - {"list"} == {"create", "update", "delete"}


@needs_cel
def test_expressions_compile(vap: Obj) -> None:
    deploy.test_vap_expressions_compile(vap)


@needs_cel
def test_own_node_may_create_update_delete(vap: Obj) -> None:
    assert evaluate(vap, "CREATE", rule("node-a"), None) == (True, "admitted")
    assert evaluate(vap, "UPDATE", rule("node-a"), rule("node-a")) == (True, "admitted")
    assert evaluate(vap, "DELETE", None, rule("node-a")) == (True, "admitted")


@needs_cel
def test_create_for_another_node_is_denied(vap: Obj) -> None:
    admitted, message = evaluate(vap, "CREATE", rule("node-b"), None)
    assert not admitted
    assert message == (
        'kubelet-dra-health on node "node-a" may write only DeviceTaintRules labelled '
        "kubelet-dra.io/node=node-a and app.kubernetes.io/managed-by=kubelet-dra-health; "
        'rule r1 is labelled for node "node-b"'
    )


@pytest.mark.parametrize(
    "new", [rule(None), rule("node-a", managed=False), rule(None, managed=False)]
)
@needs_cel
def test_create_without_our_labels_is_denied(vap: Obj, new: Obj) -> None:
    admitted, _ = evaluate(vap, "CREATE", new, None)
    assert not admitted


@needs_cel
@pytest.mark.parametrize(
    ("new", "old"),
    [
        (rule("node-a"), rule("node-b")),  # taking over another node's rule
        (rule("node-b"), rule("node-a")),  # handing ours to another node
        (rule("node-a"), rule(None, managed=False)),  # adopting an admin's rule
        (rule("node-a", managed=False), rule("node-a")),  # dropping managed-by
    ],
)
def test_update_across_nodes_is_denied(vap: Obj, new: Obj, old: Obj) -> None:
    admitted, _ = evaluate(vap, "UPDATE", new, old)
    assert not admitted


@needs_cel
@pytest.mark.parametrize("old", [rule("node-b"), rule(None, managed=False)])
def test_delete_of_others_is_denied(vap: Obj, old: Obj) -> None:
    admitted, message = evaluate(vap, "DELETE", None, old)
    assert not admitted
    assert "may change or delete only DeviceTaintRules labelled with its own node" in message


@needs_cel
@pytest.mark.parametrize("node", [None, ""])
def test_token_without_node_is_denied(vap: Obj, node: str | None) -> None:
    admitted, message = evaluate(vap, "CREATE", rule(""), None, node=node)
    assert not admitted
    assert deploy.NODE_NAME_EXTRA in message


@needs_cel
def test_other_users_are_not_matched(vap: Obj) -> None:
    admitted, message = evaluate(vap, "DELETE", None, rule("node-b"), username="admin")
    assert (admitted, message) == (True, "not matched")

"""Interop: the FakeApiServer answers pod status writes exactly like kube-apiserver 1.37.

Each case sends the same request to the real server and to the stand-in and compares what a
client can see: the HTTP code, the Status ``reason``, ``message`` and ``details.causes``, or,
for accepted writes, the stored container status and whether the resourceVersion moved. A
difference here means the fast tests (which use the stand-in) could pass on behaviour the
real server does not have; the stand-in is fixed, not this test.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kubelet_dra.testing.fakeapi import Container, FakeApiServer, PodClaim, make_pod

from ._apiserver import KubeApiServer
from ._cluster import SMP, Cluster, FakeCluster, RealCluster, container_status, error_body

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

JSON_PATCH = "application/json-patch+json"
MERGE = "application/merge-patch+json"


@pytest.fixture
def clusters(kube_apiserver: KubeApiServer) -> Iterator[tuple[RealCluster, FakeCluster]]:
    real = RealCluster(kube_apiserver)
    with FakeApiServer() as server:
        fake = FakeCluster(server)
        yield real, fake
        fake.close()
    real.close()


def new_pod(cluster: Cluster) -> tuple[str, dict[str, Any]]:
    namespace = f"cmp-{uuid.uuid4().hex[:8]}"
    cluster.ensure_namespace(namespace)
    pod = make_pod(
        "workload", "node-a", namespace=namespace, claims=[PodClaim("gpu", "gpu-claim")],
        containers=[Container("main", claims=[("gpu", "req-0")])],
    )  # fmt: skip
    return namespace, cluster.create_pod(pod)


def outcome(cluster: Cluster, namespace: str, body: Any, content_type: str = SMP) -> dict[str, Any]:
    """What a client sees of one pods/status write."""
    before = cluster.get_pod(namespace, "workload")
    try:
        cluster.patch_status(namespace, "workload", body, content_type)
    except ApiException as exc:
        error = error_body(exc)
        details = error.get("details") or {}
        return {
            "code": exc.status,
            "reason": error.get("reason"),
            "message": error.get("message"),
            "causes": details.get("causes"),
        }
    after = cluster.get_pod(namespace, "workload")
    main = container_status(after, "main")
    return {
        "code": 200,
        "allocatedResourcesStatus": main.get("allocatedResourcesStatus"),
        "rv_moved": after["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"],
    }


def both(
    clusters: tuple[RealCluster, FakeCluster], make_body: Any, content_type: str = SMP
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the same write on both; ``make_body(pod)`` builds it from each server's pod."""
    results = []
    for cluster in clusters:
        namespace, pod = new_pod(cluster)
        results.append(outcome(cluster, namespace, make_body(pod), content_type))
    return results[0], results[1]


def health_patch(resources: list[dict[str, Any]], name: str = "claim:gpu/req-0") -> Any:
    def make(pod: dict[str, Any]) -> dict[str, Any]:
        statuses = copy.deepcopy(pod["status"]["containerStatuses"])
        statuses[0]["allocatedResourcesStatus"] = [{"name": name, "resources": resources}]
        return {"status": {"containerStatuses": statuses}}

    return make


OK = {"resourceID": "x", "health": "Healthy"}

VALIDATION = [
    pytest.param("claim:gpu/req-0", [OK], id="accepted"),
    pytest.param("claim:other/req-0", [OK], id="unknown-claim"),
    pytest.param("claim:gpu", [OK], id="request-missing-from-name"),
    pytest.param("gpu", [OK], id="not-a-claim-or-request"),
    pytest.param("claim:gpu/req-0", [{"resourceID": "x", "health": "Broken"}], id="bad-health"),
    pytest.param("claim:gpu/req-0", [{"resourceID": "x"}], id="health-missing"),
    pytest.param("claim:gpu/req-0", [{**OK, "message": ""}], id="message-empty"),
    pytest.param("claim:gpu/req-0", [{**OK, "message": "m" * 1025}], id="message-1025-bytes"),
    pytest.param("claim:gpu/req-0", [{**OK, "message": "é" * 512}], id="message-1024-bytes-utf8"),
    pytest.param("claim:gpu/req-0", [{**OK, "message": "é" * 512 + "m"}], id="message-1025-utf8"),
    pytest.param("claim:gpu/req-0", [OK, {"resourceID": "x", "health": "Unknown"}], id="dup-id"),
    pytest.param("claim:gpu/req-0", [{"resourceID": "", "health": "Unknown"}], id="empty-id"),
    pytest.param(
        "claim:gpu/req-0",
        [{"resourceID": "x", "health": "Bad", "message": ""}, {"resourceID": "x"}],
        id="several-errors",
    ),
]


@pytest.mark.parametrize(("name", "resources"), VALIDATION)
def test_validation_matches(
    clusters: tuple[RealCluster, FakeCluster], name: str, resources: list[dict[str, Any]]
) -> None:
    real, fake = both(clusters, health_patch(resources, name))
    assert fake == real


def test_unchanged_write_keeps_resource_version(
    clusters: tuple[RealCluster, FakeCluster],
) -> None:
    def same(pod: dict[str, Any]) -> dict[str, Any]:
        return {"status": {"containerStatuses": pod["status"]["containerStatuses"]}}

    real, fake = both(clusters, same)
    assert real == fake
    assert real["rv_moved"] is False


def test_stale_resource_version_conflicts(clusters: tuple[RealCluster, FakeCluster]) -> None:
    def stale(pod: dict[str, Any]) -> dict[str, Any]:
        body = health_patch([OK])(pod)
        body["metadata"] = {"resourceVersion": str(int(pod["metadata"]["resourceVersion"]) - 1)}
        return body

    real, fake = both(clusters, stale)
    assert real["code"] == 409
    assert fake == real


def test_patched_uid_is_an_immutable_field(clusters: tuple[RealCluster, FakeCluster]) -> None:
    """A uid in a PATCH body is no precondition (unlike a PUT's): it fails validation."""

    def wrong_uid(pod: dict[str, Any]) -> dict[str, Any]:
        body = health_patch([OK])(pod)
        body["metadata"] = {"uid": "00000000-0000-0000-0000-000000000000"}
        return body

    real, fake = both(clusters, wrong_uid)
    assert real["code"] == 422
    assert "metadata.uid" in real["message"] and "field is immutable" in real["message"]
    assert fake == real


def test_put_with_wrong_uid_is_a_precondition_conflict(
    clusters: tuple[RealCluster, FakeCluster],
) -> None:
    results = []
    for cluster in clusters:
        namespace, pod = new_pod(cluster)
        pod["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
        with pytest.raises(ApiException) as caught:
            cluster.core.replace_namespaced_pod_status("workload", namespace, pod)
        error = error_body(caught.value)
        # The storage key and the pod's own UID differ per server.
        results.append((caught.value.status, error["reason"], error["message"].split(", UID")[0]))
    real, fake = results
    assert real[0] == 409
    assert fake[:2] == real[:2]
    assert fake[2].split("Key:")[0] == real[2].split("Key:")[0]
    assert "Precondition failed: UID in precondition: 0000" in fake[2]


def test_json_patch_test_failure(clusters: tuple[RealCluster, FakeCluster]) -> None:
    def failing_test(pod: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {"op": "test", "path": "/status/phase", "value": "Pending"},
            {"op": "replace", "path": "/status/phase", "value": "Failed"},
        ]

    real, fake = both(clusters, failing_test, JSON_PATCH)
    assert fake == real


def test_merge_patch_replaces_container_statuses(
    clusters: tuple[RealCluster, FakeCluster],
) -> None:
    """JSON merge patch replaces lists whole, like the atomic strategic merge of
    containerStatuses: a list with only our entry for main is stored as sent."""
    real, fake = both(clusters, health_patch([OK]), MERGE)
    assert real["code"] == 200
    assert fake == real


def test_gate_dependency() -> None:
    """kube-apiserver 1.37 refuses to start with ResourceHealthStatusMessage on and
    ResourceHealthStatus off (test_apiserver_smoke.py); the stand-in cannot be set so."""
    with FakeApiServer() as server:
        server.health_gate = False
        assert server.message_gate is False
        with pytest.raises(ValueError, match="depends on ResourceHealthStatus"):
            server.message_gate = True

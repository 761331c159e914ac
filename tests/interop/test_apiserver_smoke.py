"""Interop: the real kube-apiserver fixture, driven with the official ``kubernetes`` client.

Proves that the fixture works (TLS, admin token, kubeconfig, service-account tokens, RBAC)
and pins how a real 1.37 API server treats ``containerStatuses[].allocatedResourcesStatus``
on a pods/status PATCH: accepted and stored with the ResourceHealthStatus gate on, silently
dropped with it off, and the validation errors our status writer must avoid.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from ._apiserver import KubeApiServer

pytestmark = [pytest.mark.interop, pytest.mark.timeout(180)]

GATES_OFF = {"ResourceHealthStatus": False, "ResourceHealthStatusMessage": False}


@pytest.fixture
def core(kube_apiserver: KubeApiServer) -> Iterator[client.CoreV1Api]:
    with kube_apiserver.api_client() as api:
        yield client.CoreV1Api(api)


def make_pod(core: client.CoreV1Api) -> tuple[str, str]:
    """A namespace and a pod bound to a node, using claim ``gpu`` (request ``req-0``)."""
    namespace = f"interop-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="workload"),
        spec=client.V1PodSpec(
            node_name="node-a",
            resource_claims=[
                client.V1PodResourceClaim(name="gpu", resource_claim_name="gpu-claim")
            ],
            containers=[
                client.V1Container(
                    name="main",
                    image="registry.invalid/app:1",
                    resources=client.V1ResourceRequirements(
                        claims=[client.CoreV1ResourceClaim(name="gpu", request="req-0")]
                    ),
                )
            ],
        ),
    )
    core.create_namespaced_pod(namespace, pod)
    return namespace, "workload"


def read_container_status(core: client.CoreV1Api, namespace: str, pod: str) -> dict[str, Any]:
    """The first container status exactly as the server returns it (wire JSON)."""
    raw: Any = core.read_namespaced_pod_status(pod, namespace, _preload_content=False)
    status: dict[str, Any] = json.loads(raw.data)["status"]["containerStatuses"][0]
    return status


def error_message(exc: ApiException) -> str:
    return str(json.loads(exc.body or "{}").get("message", ""))


def status_patch(resources: list[dict[str, Any]], name: str = "claim:gpu/req-0") -> dict[str, Any]:
    return {
        "status": {
            "containerStatuses": [
                {
                    "name": "main",
                    "image": "registry.invalid/app:1",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"waiting": {"reason": "ContainerCreating"}},
                    "allocatedResourcesStatus": [{"name": name, "resources": resources}],
                }
            ]
        }
    }


def test_fixture_basics(kube_apiserver: KubeApiServer, core: client.CoreV1Api) -> None:
    with kube_apiserver.api_client() as api:
        assert client.VersionApi(api).get_code().git_version == "v1.37.2"
    names = {ns.metadata.name for ns in core.list_namespace().items if ns.metadata}
    assert {"default", "kube-system"} <= names
    # The written kubeconfig works with the client's own loader.
    loaded = client.Configuration()
    config.load_kube_config(config_file=str(kube_apiserver.kubeconfig), client_configuration=loaded)
    with client.ApiClient(loaded) as api:
        assert client.CoreV1Api(api).read_namespace("default").metadata is not None


def test_service_account_token_is_subject_to_rbac(kube_apiserver: KubeApiServer) -> None:
    namespace = f"interop-{uuid.uuid4().hex[:8]}"
    token = kube_apiserver.service_account_token(namespace, "health-writer")
    with kube_apiserver.api_client(token) as api:
        with pytest.raises(ApiException) as denied:
            client.CoreV1Api(api).list_namespaced_pod(namespace)
        assert denied.value.status == 403
        user = f"system:serviceaccount:{namespace}:health-writer"
        assert user in error_message(denied.value)


def test_allocated_resources_status_accepted(core: client.CoreV1Api) -> None:
    namespace, pod = make_pod(core)
    resources = [
        {"resourceID": "gpu.example.com/pool-0/gpu-0", "health": "Unhealthy", "message": "ECC"},
        {"resourceID": "gpu.example.com/pool-0/gpu-1", "health": "Healthy"},
    ]
    core.patch_namespaced_pod_status(pod, namespace, status_patch(resources))
    stored = read_container_status(core, namespace, pod)
    assert stored["allocatedResourcesStatus"] == [
        {"name": "claim:gpu/req-0", "resources": resources}
    ]


OK_ID = {"resourceID": "x", "health": "Healthy"}
PREFIX = "status.containerStatuses[0].allocatedResourcesStatus[0]."


@pytest.mark.parametrize(
    ("name", "resources", "error_part"),
    [
        pytest.param(
            "claim:other/req-0",
            [OK_ID],
            PREFIX + 'name: Invalid value: "claim:other/req-0"',
            id="unknown-claim",
        ),
        pytest.param(
            "claim:gpu",
            [OK_ID],
            PREFIX + 'name: Invalid value: "claim:gpu"',
            id="request-missing-from-name",
        ),
        pytest.param(
            "claim:gpu/req-0",
            [{"resourceID": "x", "health": "Broken"}],
            PREFIX + 'resources[0].health: Unsupported value: "Broken"',
            id="bad-health",
        ),
        pytest.param(
            "claim:gpu/req-0",
            [{"resourceID": "x"}],
            PREFIX + 'resources[0].health: Unsupported value: ""',
            id="health-missing",
        ),
        pytest.param(
            "claim:gpu/req-0",
            [{**OK_ID, "message": "m" * 1025}],
            PREFIX + "resources[0].message: Too long: may not be more than 1024 bytes",
            id="message-too-long",
        ),
        pytest.param(
            "claim:gpu/req-0",
            [{**OK_ID, "message": ""}],
            PREFIX + "resources[0].message: Required value: must be non-empty if specified",
            id="message-empty",
        ),
        pytest.param(
            "claim:gpu/req-0",
            [OK_ID, {"resourceID": "x", "health": "Unknown"}],
            PREFIX + 'resources[1].resourceID: Duplicate value: "x"',
            id="duplicate-id",
        ),
    ],
)
def test_allocated_resources_status_validation(
    core: client.CoreV1Api, name: str, resources: list[dict[str, Any]], error_part: str
) -> None:
    namespace, pod = make_pod(core)
    with pytest.raises(ApiException) as rejected:
        core.patch_namespaced_pod_status(pod, namespace, status_patch(resources, name=name))
    assert rejected.value.status == 422
    assert error_part in error_message(rejected.value)


def test_empty_resource_id_is_accepted(core: client.CoreV1Api) -> None:
    """Despite the API comment, an empty resourceID passes validation."""
    namespace, pod = make_pod(core)
    core.patch_namespaced_pod_status(
        pod, namespace, status_patch([{"resourceID": "", "health": "Unknown"}])
    )
    stored = read_container_status(core, namespace, pod)
    assert stored["allocatedResourcesStatus"][0]["resources"] == [
        {"resourceID": "", "health": "Unknown"}
    ]


@pytest.mark.kube_apiserver(feature_gates=GATES_OFF)
def test_allocated_resources_status_dropped_when_gate_off(
    kube_apiserver: KubeApiServer, core: client.CoreV1Api
) -> None:
    assert kube_apiserver.feature_gates["ResourceHealthStatus"] is False
    namespace, pod = make_pod(core)
    resources = [{"resourceID": "gpu.example.com/pool-0/gpu-0", "health": "Unhealthy"}]
    core.patch_namespaced_pod_status(pod, namespace, status_patch(resources))
    stored = read_container_status(core, namespace, pod)
    assert stored["name"] == "main"  # the rest of the patch was applied
    assert stored["state"] == {"waiting": {"reason": "ContainerCreating"}}
    assert "allocatedResourcesStatus" not in stored


def test_message_gate_depends_on_health_gate(kube_apiserver_factory: Any) -> None:
    """1.37 enforces gate dependencies: ResourceHealthStatusMessage (beta, on by default)
    needs ResourceHealthStatus, so turning only the latter off stops the server."""
    with pytest.raises(RuntimeError, match="depends on features that are disabled"):
        kube_apiserver_factory(feature_gates={"ResourceHealthStatus": False})

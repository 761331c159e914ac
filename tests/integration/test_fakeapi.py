"""FakeApiServer behaves like the kube-apiserver as seen through the official kubernetes client."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
import kubernetes.watch
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from kubelet_dra.testing.fakeapi import (
    Container,
    FakeApiServer,
    PodClaim,
    make_claim,
    make_pod,
)

pytestmark = pytest.mark.timeout(30)

NODE_SELECTOR = "spec.nodeName=node-1"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


@pytest.fixture
def client(api: FakeApiServer) -> Iterator[kubernetes.client.ApiClient]:
    with api.api_client() as api_client:
        yield api_client


@pytest.fixture
def core(client: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(client)


def _gpu_pod(api: FakeApiServer, name: str = "p", node: str = "node-1") -> dict[str, Any]:
    containers = [
        Container("main", claims=[("gpu", "req-0")], requests={"cpu": "1"}),
        Container("side", claims=["gpu"]),
    ]
    return api.create_pod(make_pod(name, node, claims=["gpu"], containers=containers))


def _health(
    name: str, health: str = "Healthy", rid: str = "gpu.example.com/pool/dev-0", **extra: Any
) -> dict[str, Any]:
    return {"name": name, "resources": [{"resourceID": rid, "health": health, **extra}]}


def _statuses_with(pod: dict[str, Any], container: str, entry: dict[str, Any]) -> list[Any]:
    statuses = [dict(cs) for cs in pod["status"]["containerStatuses"]]
    for cs in statuses:
        if cs["name"] == container:
            cs["allocatedResourcesStatus"] = [entry]
    return statuses


def _error(err: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(err.body)
    return body


def _collect(
    stream: Iterator[dict[str, Any]], watch: kubernetes.watch.Watch, count: int
) -> list[tuple[str, str]]:
    seen = []
    for event in stream:
        seen.append((event["type"], event["raw_object"]["metadata"].get("name", "")))
        if len(seen) == count:
            watch.stop()
    return seen


# --- list and watch ------------------------------------------------------------------------


def test_list_with_node_field_selector_returns_only_that_nodes_pods(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.create_pod(make_pod("a", "node-1"))
    api.create_pod(make_pod("b", "node-2"))
    pods = core.list_pod_for_all_namespaces(field_selector=NODE_SELECTOR)
    assert [p.metadata.name for p in pods.items] == ["a"]
    assert pods.metadata.resource_version == str(api.resource_version)
    assert api.requests[-1].query["fieldSelector"] == NODE_SELECTOR


def test_unsupported_field_label_is_400(core: kubernetes.client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        core.list_pod_for_all_namespaces(field_selector="spec.bogus=x")
    assert caught.value.status == 400
    assert _error(caught.value)["message"] == "field label not supported: spec.bogus"


def test_watch_sends_added_modified_and_deleted_when_pod_stops_matching(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.create_pod(make_pod("a", "node-1"))
    rv = core.list_pod_for_all_namespaces(field_selector=NODE_SELECTOR).metadata.resource_version
    api.set_pod_status("default", "a", {"phase": "Succeeded"})
    api.create_pod(make_pod("b", "node-1"))
    api.create_pod(make_pod("other-node", "node-2"))

    def move(pod: dict[str, Any]) -> dict[str, Any]:
        pod["spec"]["nodeName"] = "node-2"
        return pod

    api.update_pod("default", "a", move)
    api.delete_pod("default", "b")
    watch = kubernetes.watch.Watch()
    stream = watch.stream(
        core.list_pod_for_all_namespaces,
        field_selector=NODE_SELECTOR,
        resource_version=rv,
        timeout_seconds=10,
    )
    assert _collect(stream, watch, 4) == [
        ("MODIFIED", "a"),
        ("ADDED", "b"),
        ("DELETED", "a"),
        ("DELETED", "b"),
    ]


def test_watch_delivers_live_changes_to_a_running_stream(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    def writer() -> None:
        api.wait_for(lambda: api.count("GET", r"^/api/v1/pods$") >= 1)
        api.create_pod(make_pod("live", "node-1"))
        api.delete_pod("default", "live")

    thread = threading.Thread(target=writer)
    thread.start()
    watch = kubernetes.watch.Watch()
    rv = str(api.resource_version)
    stream = watch.stream(
        core.list_pod_for_all_namespaces,
        field_selector=NODE_SELECTOR,
        resource_version=rv,
        timeout_seconds=10,
    )
    assert _collect(stream, watch, 2) == [("ADDED", "live"), ("DELETED", "live")]
    thread.join()


def test_watch_without_resource_version_starts_with_added_then_bookmarks(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.create_pod(make_pod("a", "node-1"))
    watch = kubernetes.watch.Watch()
    kinds = []
    for event in watch.stream(
        core.list_pod_for_all_namespaces, allow_watch_bookmarks=True, timeout_seconds=10
    ):
        kinds.append(event["type"])
        if event["type"] == "ADDED":
            api.send_bookmarks()
        else:
            assert event["raw_object"]["metadata"]["resourceVersion"] == str(api.resource_version)
            watch.stop()
    assert kinds == ["ADDED", "BOOKMARK"]


def test_watch_from_compacted_resource_version_gets_410_expired(
    api: FakeApiServer, client: kubernetes.client.ApiClient
) -> None:
    core = kubernetes.client.CoreV1Api(client)
    rv = core.list_pod_for_all_namespaces().metadata.resource_version
    api.create_pod(make_pod("a"))
    api.expire_history()
    # Not preloaded: the raw urllib3 response, which the client's types do not say.
    response: Any = core.list_pod_for_all_namespaces(
        watch=True, resource_version=rv, _preload_content=False
    )
    event = json.loads(response.read().splitlines()[0])
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410
    assert event["object"]["reason"] == "Expired"
    with pytest.raises(ApiException) as caught:
        list(
            kubernetes.watch.Watch().stream(
                core.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=5
            )
        )
    assert caught.value.status == 410


def test_watch_ends_when_the_server_side_timeout_passes(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.max_watch_seconds = 0.2
    started = time.monotonic()
    events = list(
        kubernetes.watch.Watch().stream(
            core.list_pod_for_all_namespaces,
            resource_version=str(api.resource_version),
            timeout_seconds=20,
        )
    )
    assert events == []
    assert time.monotonic() - started < 10


# --- status writes -------------------------------------------------------------------------


def test_strategic_merge_patch_merges_conditions_and_replaces_container_statuses(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    pod = _gpu_pod(api)
    only_main = _statuses_with(pod, "main", _health("claim:gpu/req-0"))[:1]
    body = {
        "metadata": {"uid": pod["metadata"]["uid"]},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "DeviceHealthy", "status": "True"},
            ],
            "containerStatuses": only_main,
        },
    }
    result = core.patch_namespaced_pod_status("p", "default", body)
    conditions = {c.type: c.status for c in result.status.conditions}
    assert conditions["Ready"] == "False"
    assert conditions["DeviceHealthy"] == "True"
    assert conditions["PodScheduled"] == "True"
    assert [cs.name for cs in result.status.container_statuses] == ["main"]
    assert result.status.container_statuses[0].allocated_resources_status[0].name == (
        "claim:gpu/req-0"
    )
    assert api.requests[-1].content_type == STRATEGIC


def test_strategic_merge_patch_merges_resource_claim_statuses_by_name(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.create_pod(
        make_pod(
            "t",
            claims=[PodClaim("a", "t-a-x", template="tpl"), PodClaim("b", "t-b-x", template="tpl")],
        )
    )
    body = {"status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "t-b-y"}]}}
    result = core.patch_namespaced_pod_status("t", "default", body)
    assert [(s.name, s.resource_claim_name) for s in result.status.resource_claim_statuses] == [
        ("a", "t-a-x"),
        ("b", "t-b-y"),
    ]


def test_strategic_merge_patch_directives_are_honoured(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.create_pod(make_pod("p"))
    body = {
        "status": {
            "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "PodScheduled"}],
            "conditions": [{"type": "Initialized", "$patch": "delete"}],
        }
    }
    result = core.patch_namespaced_pod_status("p", "default", body)
    types = [c.type for c in result.status.conditions]
    assert "Initialized" not in types
    assert types[:2] == ["Ready", "PodScheduled"]


def test_json_merge_patch_replaces_lists_whole(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.create_pod(make_pod("p"))
    body = {"status": {"conditions": [{"type": "DeviceHealthy", "status": "True"}], "podIP": None}}
    result = core.patch_namespaced_pod_status("p", "default", body, _content_type=MERGE)
    assert [c.type for c in result.status.conditions] == ["DeviceHealthy"]
    assert result.status.pod_ip is None
    assert api.requests[-1].content_type == MERGE


def test_json_patch_applies_when_test_op_holds(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.create_pod(make_pod("p"))
    ops = [
        {"op": "test", "path": "/status/phase", "value": "Running"},
        {"op": "replace", "path": "/status/phase", "value": "Failed"},
        {"op": "add", "path": "/status/conditions/-", "value": {"type": "X", "status": "True"}},
    ]
    result = core.patch_namespaced_pod_status("p", "default", ops)
    assert result.status.phase == "Failed"
    assert result.status.conditions[-1].type == "X"
    assert api.requests[-1].content_type == JSON_PATCH


def test_json_patch_failed_test_op_is_422_and_changes_nothing(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    rv = api.create_pod(make_pod("p"))["metadata"]["resourceVersion"]
    ops = [
        {"op": "test", "path": "/status/phase", "value": "Pending"},
        {"op": "replace", "path": "/status/phase", "value": "Failed"},
    ]
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod_status("p", "default", ops)
    status = _error(caught.value)
    assert caught.value.status == 422
    assert status["reason"] == "Invalid"
    # As kube-apiserver 1.37 (tests/interop/test_interop_fakeapi.py): no causes in details.
    assert status["message"] == "the server rejected our request due to an error in our request"
    assert status["details"] == {}
    assert api.get_pod("default", "p")["metadata"]["resourceVersion"] == rv


def test_put_status_with_stale_resource_version_is_409_conflict(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.create_pod(make_pod("p"))
    stale = core.read_namespaced_pod_status("p", "default")
    api.set_pod_status("default", "p", {"phase": "Running", "podIP": "10.0.0.99"})
    stale.status.phase = "Failed"
    with pytest.raises(ApiException) as caught:
        core.replace_namespaced_pod_status("p", "default", stale)
    assert caught.value.status == 409
    assert _error(caught.value)["reason"] == "Conflict"
    fresh = core.read_namespaced_pod("p", "default")
    fresh.status.phase = "Failed"
    assert core.replace_namespaced_pod_status("p", "default", fresh).status.phase == "Failed"


@pytest.mark.parametrize(
    ("metadata", "code", "message_part"),
    [
        ({"resourceVersion": "1"}, 409, "the object has been modified"),
        # A patched uid is an immutable-field error, as in kube-apiserver 1.37 (interop tests).
        ({"uid": "not-the-uid"}, 422, 'metadata.uid: Invalid value: "not-the-uid"'),
    ],
    ids=["stale-resource-version", "wrong-uid"],
)
def test_patch_precondition_mismatch_is_refused(
    api: FakeApiServer,
    core: kubernetes.client.CoreV1Api,
    metadata: dict[str, str],
    code: int,
    message_part: str,
) -> None:
    api.create_pod(make_pod("p"))
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod_status(
            "p", "default", {"metadata": metadata, "status": {"phase": "Failed"}}
        )
    assert caught.value.status == code
    assert _error(caught.value)["reason"] == ("Conflict" if code == 409 else "Invalid")
    assert message_part in _error(caught.value)["message"]


def test_noop_status_write_keeps_resource_version(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    pod = api.create_pod(make_pod("p"))
    result = core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running"}})
    assert result.metadata.resource_version == pod["metadata"]["resourceVersion"]


def test_status_write_changes_only_status(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.create_pod(make_pod("p"))
    body = {
        "metadata": {"labels": {"new": "label"}},
        "spec": {"nodeName": "elsewhere"},
        "status": {"phase": "Failed"},
    }
    result = core.patch_namespaced_pod_status("p", "default", body, _content_type=MERGE)
    assert result.status.phase == "Failed"
    assert result.spec.node_name == "node-1"
    assert "new" not in (result.metadata.labels or {})


# --- validation ----------------------------------------------------------------------------

_VALID = [
    ("main", _health("claim:gpu/req-0")),
    ("side", _health("claim:gpu")),
    ("main", _health("cpu")),
    ("main", _health("claim:gpu/req-0", "Unhealthy", message="ECC errors")),
]
_INVALID = [
    ("main", _health("claim:other/req-0"), "allocatedResourcesStatus[0].name", "FieldValueInvalid"),
    ("main", _health("claim:gpu"), "allocatedResourcesStatus[0].name", "FieldValueInvalid"),
    ("side", _health("claim:gpu/req-0"), "allocatedResourcesStatus[0].name", "FieldValueInvalid"),
    ("main", _health("memory"), "allocatedResourcesStatus[0].name", "FieldValueInvalid"),
    ("main", _health("claim:gpu/req-0", "Broken"), "resources[0].health", "FieldValueNotSupported"),
    # FieldValueRequired, as kube-apiserver 1.37 (tests/interop/test_interop_fakeapi.py).
    ("main", _health("claim:gpu/req-0", message=""), "resources[0].message", "FieldValueRequired"),
    (
        "main",
        _health("claim:gpu/req-0", message="é" * 513),
        "resources[0].message",
        "FieldValueTooLong",
    ),
    (
        "main",
        {
            "name": "claim:gpu/req-0",
            "resources": [
                {"resourceID": "d", "health": "Healthy"},
                {"resourceID": "d", "health": "Healthy"},
            ],
        },
        "resources[1].resourceID",
        "FieldValueDuplicate",
    ),
]


@pytest.mark.parametrize(
    ("container", "entry"),
    _VALID,
    ids=["claim-request", "claim-no-request", "resource-request", "message"],
)
def test_valid_allocated_resources_status_is_accepted(
    api: FakeApiServer,
    core: kubernetes.client.CoreV1Api,
    container: str,
    entry: dict[str, Any],
) -> None:
    pod = _gpu_pod(api)
    body = {"status": {"containerStatuses": _statuses_with(pod, container, entry)}}
    result = core.patch_namespaced_pod_status("p", "default", body)
    by_name = {cs.name: cs for cs in result.status.container_statuses}
    assert by_name[container].allocated_resources_status[0].name == entry["name"]


@pytest.mark.parametrize(
    ("container", "entry", "field_suffix", "reason"),
    _INVALID,
    ids=[
        "unknown-claim",
        "missing-request",
        "request-not-in-spec",
        "unknown-resource",
        "bad-health",
        "empty-message",
        "message-over-1024-bytes",
        "duplicate-resource-id",
    ],
)
def test_invalid_allocated_resources_status_is_422(
    api: FakeApiServer,
    core: kubernetes.client.CoreV1Api,
    container: str,
    entry: dict[str, Any],
    field_suffix: str,
    reason: str,
) -> None:
    pod = _gpu_pod(api)
    body = {"status": {"containerStatuses": _statuses_with(pod, container, entry)}}
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod_status("p", "default", body)
    status = _error(caught.value)
    assert caught.value.status == 422
    assert status["reason"] == "Invalid"
    assert status["message"].startswith('Pod "p" is invalid: status.containerStatuses[')
    cause = status["details"]["causes"][0]
    assert cause["field"].endswith(field_suffix)
    assert cause["reason"] == reason


def test_init_container_statuses_are_validated_and_unknown_containers_skip_name_check(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    pod = make_pod("p", claims=["gpu"])
    pod["spec"]["initContainers"] = [
        {"name": "init", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}
    ]
    api.create_pod(pod)
    init = {
        "name": "init",
        "image": "x",
        "imageID": "x",
        "ready": False,
        "restartCount": 0,
        "allocatedResourcesStatus": [_health("claim:nope")],
    }
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod_status(
            "p", "default", {"status": {"initContainerStatuses": [init]}}
        )
    assert _error(caught.value)["details"]["causes"][0]["field"] == (
        "status.initContainerStatuses[0].allocatedResourcesStatus[0].name"
    )
    init["name"] = "not-in-spec"
    core.patch_namespaced_pod_status("p", "default", {"status": {"initContainerStatuses": [init]}})


# --- feature gates ---------------------------------------------------------------------------


def test_health_gate_off_silently_drops_allocated_resources_status(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    pod = _gpu_pod(api)
    api.health_gate = False
    statuses = _statuses_with(pod, "main", _health("claim:gpu/req-0"))
    statuses[0]["restartCount"] = 1
    result = core.patch_namespaced_pod_status(
        "p", "default", {"status": {"containerStatuses": statuses}}
    )
    assert result.status.container_statuses[0].restart_count == 1
    assert result.status.container_statuses[0].allocated_resources_status is None


def test_message_gate_off_drops_only_the_message(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    pod = _gpu_pod(api)
    api.message_gate = False
    entry = _health("claim:gpu/req-0", "Unhealthy", message="ECC errors")
    result = core.patch_namespaced_pod_status(
        "p", "default", {"status": {"containerStatuses": _statuses_with(pod, "main", entry)}}
    )
    health = result.status.container_statuses[0].allocated_resources_status[0].resources[0]
    assert (health.health, health.message) == ("Unhealthy", None)


# --- faults ----------------------------------------------------------------------------------


def test_injected_500_fails_once_then_the_request_succeeds(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.create_pod(make_pod("p"))
    fault = api.fail("PATCH", r"/pods/p/status$", code=500)
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Failed"}})
    assert caught.value.status == 500
    assert _error(caught.value)["reason"] == "InternalError"
    core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Failed"}})
    assert fault.hits == 1
    assert [r.status for r in api.status_writes("default", "p")] == [500, 200]


def test_injected_429_carries_retry_after(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.create_pod(make_pod("p"))
    api.fail("PATCH", r"/status$", code=429, retry_after=3, times=None)
    for _ in range(2):
        with pytest.raises(ApiException) as caught:
            core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Failed"}})
        assert caught.value.status == 429
        assert caught.value.headers["Retry-After"] == "3"
        assert _error(caught.value)["details"]["retryAfterSeconds"] == 3
    api.clear_faults()
    core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Failed"}})


def test_get_answered_429_with_retry_after_is_retried_by_urllib3(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.fail("GET", r"^/api/v1/pods$", code=429, retry_after=0)
    assert core.list_pod_for_all_namespaces().items == []
    assert [r.status for r in api.requests] == [429, 200]


def test_injected_delay_slows_matching_requests(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.delay("GET", r"^/api/v1/pods$", 0.3, times=1)
    started = time.monotonic()
    core.list_pod_for_all_namespaces()
    assert time.monotonic() - started >= 0.3


def test_dropped_connection_surfaces_as_a_connection_error(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.create_pod(make_pod("p"))
    api.drop_connection("PATCH", r"/status$")
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Failed"}})
    core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Failed"}})
    assert [r.status for r in api.status_writes()] == [0, 200]


def test_conflict_first_write_answers_409_once_per_pod(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.create_pod(make_pod("p"))
    api.conflict_first_write = True
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Failed"}})
    assert caught.value.status == 409
    core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Failed"}})
    assert [r.status for r in api.status_writes("default", "p")] == [409, 200]


# --- claims, events, kubelet, clients ----------------------------------------------------------


def test_resource_claims_get_list_and_watch(
    api: FakeApiServer, client: kubernetes.client.ApiClient
) -> None:
    resource = kubernetes.client.ResourceV1Api(client)
    pod = api.create_pod(make_pod("p", claims=["gpu"]))
    api.create_claim(
        make_claim(
            "gpu", results=[("gpu.example.com", "pool", "dev-0", "req-0")], reserved_for=[pod]
        )
    )
    api.create_claim(make_claim("other", "team-b"))
    claim = resource.read_namespaced_resource_claim("gpu", "default")
    result = claim.status.allocation.devices.results[0]
    assert (result.driver, result.pool, result.device, result.request) == (
        "gpu.example.com",
        "pool",
        "dev-0",
        "req-0",
    )
    assert claim.status.reserved_for[0].uid == pod["metadata"]["uid"]
    listed = resource.list_resource_claim_for_all_namespaces()
    assert [c.metadata.name for c in listed.items] == ["gpu", "other"]
    selected = resource.list_namespaced_resource_claim(
        "default", field_selector="metadata.name=gpu"
    )
    assert [c.metadata.name for c in selected.items] == ["gpu"]
    api.delete_claim("default", "gpu")
    # The v37 client derives "V1ResourceClaim" from the list type, a model it does not have.
    watch = kubernetes.watch.Watch(return_type=kubernetes.client.ResourceV1ResourceClaim)
    stream = watch.stream(
        resource.list_namespaced_resource_claim,
        "default",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=10,
    )
    assert _collect(stream, watch, 1) == [("DELETED", "gpu")]


def test_events_are_created_patched_and_listed(
    api: FakeApiServer, client: kubernetes.client.ApiClient
) -> None:
    core = kubernetes.client.CoreV1Api(client)
    event = {
        "metadata": {"name": "p.123", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
        "reason": "DeviceUnhealthy",
        "message": "gpu dev-0 is unhealthy",
        "type": "Warning",
        "count": 1,
    }
    core.create_namespaced_event("default", event)
    core.patch_namespaced_event("p.123", "default", {"count": 2})
    events_v1 = kubernetes.client.EventsV1Api(client)
    events_v1.create_namespaced_event(
        "default",
        {
            "metadata": {"generateName": "p."},
            "reason": "DeviceUnhealthy",
            "action": "Report",
            "eventTime": "2025-01-01T00:00:00.000000Z",
            "reportingController": "kubelet-dra",
            "reportingInstance": "node-1",
            "regarding": {"kind": "Pod", "name": "p"},
        },
    )
    stored = api.events()
    assert [(e["apiVersion"], e["reason"]) for e in stored] == [
        ("v1", "DeviceUnhealthy"),
        ("events.k8s.io/v1", "DeviceUnhealthy"),
    ]
    assert stored[0]["count"] == 2
    assert core.list_namespaced_event("default").items[0].count == 2


def test_kubelet_write_replaces_container_statuses_and_bumps_resource_version(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    pod = _gpu_pod(api)
    entry = _health("claim:gpu/req-0")
    written = core.patch_namespaced_pod_status(
        "p", "default", {"status": {"containerStatuses": _statuses_with(pod, "main", entry)}}
    )
    after = api.kubelet_write("default", "p")
    assert int(after["metadata"]["resourceVersion"]) > int(written.metadata.resource_version)
    assert all("allocatedResourcesStatus" not in cs for cs in after["status"]["containerStatuses"])
    writer = api.start_kubelet(0.02, pods=[("default", "p")])
    api.wait_for(lambda: writer.writes >= 2)
    writer.stop()


def test_kubeconfig_and_bearer_token_are_required_and_accepted(
    api: FakeApiServer, tmp_path: Path
) -> None:
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(
        config_file=str(api.write_kubeconfig(tmp_path / "kc")),
        client_configuration=config,
        persist_config=False,
    )
    with kubernetes.client.ApiClient(config) as client:
        assert kubernetes.client.CoreV1Api(client).list_namespaced_pod("default").items == []
    anonymous = kubernetes.client.Configuration()
    anonymous.host = api.url
    with (
        kubernetes.client.ApiClient(anonymous) as client,
        pytest.raises(ApiException) as caught,
    ):
        kubernetes.client.CoreV1Api(client).list_namespaced_pod("default")
    assert caught.value.status == 401


def test_request_log_records_every_request(
    api: FakeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    api.create_pod(make_pod("a"))
    api.create_pod(make_pod("b"))
    core.patch_namespaced_pod_status("a", "default", {"status": {"phase": "Failed"}})
    core.patch_namespaced_pod_status("a", "default", {"status": {"phase": "Succeeded"}})
    core.patch_namespaced_pod_status("b", "default", {"status": {"phase": "Failed"}})
    core.read_namespaced_pod("a", "default")
    assert len(api.status_writes("default", "a")) == 2
    assert len(api.status_writes("default", "b")) == 1
    assert api.count("GET") == 1
    record = api.status_writes("default", "b")[0]
    assert (record.method, record.status, record.body) == (
        "PATCH",
        200,
        {"status": {"phase": "Failed"}},
    )
    api.reset_log()
    assert api.requests == []

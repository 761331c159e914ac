"""The fault suite's own checks: ``unknown_writes`` sees every body shape a writer sends.

``unknown_writes`` once skipped every body that was not a dict, so the JSON
patches the status writer sends (``kube/patchplan.py``) were never looked at
and the "no Unknown blip" assertions could not fail. It now reads the pod as
the stand-in stored it after each accepted write.
"""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest

from kubelet_dra.testing import FakeApiServer

from . import _faults as fx

ARS = "/status/containerStatuses/0/allocatedResourcesStatus"


def _entries(health: str) -> list[dict[str, Any]]:
    return [
        {
            "name": "claim:claim-p",
            "resources": [{"resourceID": fx.resource_id(0), "health": health}],
        }
    ]


def _patch(api: FakeApiServer, body: Any, **kwargs: Any) -> None:
    with api.api_client() as client:
        kubernetes.client.CoreV1Api(client).patch_namespaced_pod_status(
            "p", "default", body, **kwargs
        )


@pytest.fixture
def pod(api: FakeApiServer) -> FakeApiServer:
    fx.add_pod(api, "p", 0)
    return api


def test_a_json_patch_giving_unknown_is_seen(pod: FakeApiServer) -> None:
    _patch(pod, [{"op": "add", "path": ARS, "value": _entries("Healthy")}])
    assert fx.unknown_writes(pod) == []
    _patch(pod, [{"op": "add", "path": ARS, "value": _entries("Unknown")}])
    assert fx.unknown_writes(pod) == [
        f"/api/v1/namespaces/default/pods/p/status: {fx.resource_id(0)}"
    ]


def test_a_json_patch_of_one_field_is_seen_on_the_pod_it_leaves(pod: FakeApiServer) -> None:
    _patch(pod, [{"op": "add", "path": ARS, "value": _entries("Healthy")}])
    _patch(pod, [{"op": "replace", "path": f"{ARS}/0/resources/0/health", "value": "Unknown"}])
    assert len(fx.unknown_writes(pod)) == 1


def test_a_merge_patch_giving_unknown_is_seen(pod: FakeApiServer) -> None:
    statuses = pod.get_pod("default", "p")["status"]["containerStatuses"]
    statuses[0]["allocatedResourcesStatus"] = _entries("Unknown")
    _patch(
        pod,
        {"status": {"containerStatuses": statuses}},
        _content_type="application/merge-patch+json",
    )
    assert len(fx.unknown_writes(pod)) == 1


def test_a_refused_write_and_an_earlier_one_do_not_count(pod: FakeApiServer) -> None:
    _patch(pod, [{"op": "add", "path": ARS, "value": _entries("Unknown")}])
    later = pod.status_writes()[-1].timestamp + 1e-6
    with pytest.raises(kubernetes.client.ApiException):
        _patch(
            pod,
            [
                {"op": "test", "path": "/metadata/uid", "value": "not-this-pod"},
                {"op": "add", "path": ARS, "value": _entries("Unknown")},
            ],
        )
    assert fx.unknown_writes(pod, since=later) == []

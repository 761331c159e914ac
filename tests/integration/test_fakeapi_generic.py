"""The FakeApiServer's type registry, through the official client's CustomObjectsApi."""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from kubelet_dra.testing.fakeapi import ApiError, FakeApiServer

GROUP, PLURAL, KIND = "example.com", "widgets", "Widget"


def test_served_types_list_in_pages_get_create_and_delete() -> None:
    with FakeApiServer() as api, api.api_client() as client:
        custom = kubernetes.client.CustomObjectsApi(client)
        with pytest.raises(ApiException) as exc:
            custom.list_cluster_custom_object(GROUP, "v1", PLURAL)
        assert exc.value.status == 404, "not served until asked"
        api.serve_resource(f"{GROUP}/v1", PLURAL, KIND)
        for name in ("c", "a", "b"):
            api.create_object(f"{GROUP}/v1", PLURAL, {"metadata": {"name": name}, "spec": {}})
        created = custom.create_cluster_custom_object(
            GROUP, "v1", PLURAL, {"metadata": {"name": "d", "labels": {"x": "y"}}}
        )
        assert created["kind"] == KIND and "namespace" not in created["metadata"]
        first = custom.list_cluster_custom_object(GROUP, "v1", PLURAL, limit=3)
        assert [i["metadata"]["name"] for i in first["items"]] == ["a", "b", "c"]
        assert first["metadata"]["remainingItemCount"] == 1
        rest = custom.list_cluster_custom_object(
            GROUP, "v1", PLURAL, limit=3, _continue=first["metadata"]["continue"]
        )
        assert [i["metadata"]["name"] for i in rest["items"]] == ["d"]
        assert "continue" not in rest["metadata"]
        labelled = custom.list_cluster_custom_object(GROUP, "v1", PLURAL, label_selector="x=y")
        assert [i["metadata"]["name"] for i in labelled["items"]] == ["d"]
        assert custom.get_cluster_custom_object(GROUP, "v1", PLURAL, "a")["metadata"]["name"] == "a"
        custom.delete_cluster_custom_object(GROUP, "v1", PLURAL, "a")
        with pytest.raises(ApiException) as exc:
            custom.get_cluster_custom_object(GROUP, "v1", PLURAL, "a")
        assert exc.value.status == 404
        with pytest.raises(ApiException) as exc:
            custom.list_cluster_custom_object(GROUP, "v1beta2", PLURAL)
        assert exc.value.status == 404, "another version is another type"
        versions = [
            int(o["metadata"]["resourceVersion"]) for o in api.objects(f"{GROUP}/v1", PLURAL)
        ]
        assert len(set(versions)) == 3 and max(versions) <= api.resource_version


def test_a_served_type_is_in_discovery_and_watched_like_a_modelled_one() -> None:
    with FakeApiServer() as api, api.api_client() as client:
        api.serve_resource(f"{GROUP}/v1", PLURAL, KIND, namespaced=True)
        custom = kubernetes.client.CustomObjectsApi(client)
        doc = custom.get_api_resources(GROUP, "v1")
        assert [(r.name, r.namespaced) for r in doc.resources] == [(PLURAL, True)]
        listed = custom.list_namespaced_custom_object(GROUP, "v1", "team", PLURAL)
        api.create_object(f"{GROUP}/v1", PLURAL, {"metadata": {"name": "w", "namespace": "team"}})
        # With _preload_content=False the client answers the raw urllib3 response.
        stream: Any = custom.list_namespaced_custom_object(
            GROUP,
            "v1",
            "team",
            PLURAL,
            watch=True,
            resource_version=listed["metadata"]["resourceVersion"],
            timeout_seconds=5,
            _preload_content=False,
        )
        first = json.loads(stream.readline())
        stream.close()
        assert first["type"] == "ADDED" and first["object"]["metadata"]["namespace"] == "team"


def test_device_taint_rules_keep_their_write_rules_when_created_through_the_registry() -> None:
    with FakeApiServer() as api:
        bad = {"metadata": {"name": "r"}, "spec": {"taint": {"key": "k", "effect": "Evict"}}}
        with pytest.raises(ApiError) as err:
            api.create_object("resource.k8s.io/v1beta2", "devicetaintrules", bad)
        assert err.value.code == 422
        bad["spec"]["taint"]["effect"] = "NoSchedule"
        api.create_object("resource.k8s.io/v1beta2", "devicetaintrules", bad)
        stored = api.objects("resource.k8s.io/v1", "devicetaintrules")  # one storage
        assert [r["metadata"]["name"] for r in stored] == ["r"]
        assert stored[0]["spec"]["taint"]["timeAdded"]

"""The FakeApiServer's extra resource types, through the official client's CustomObjectsApi."""

from __future__ import annotations

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from kubelet_dra.testing import FakeApiServer

GROUP, PLURAL = "resource.k8s.io", "devicetaintrules"


def test_served_types_list_in_pages_get_create_and_delete() -> None:
    with FakeApiServer() as api, api.api_client() as client:
        api.device_taint_versions = ()  # the modelled resource off: only what is asked for
        custom = kubernetes.client.CustomObjectsApi(client)
        with pytest.raises(ApiException) as exc:
            custom.list_cluster_custom_object(GROUP, "v1", PLURAL)
        assert exc.value.status == 404, "not served until asked"
        api.serve_resource(f"{GROUP}/v1", PLURAL, "DeviceTaintRule")
        for name in ("c", "a", "b"):
            api.create_object(f"{GROUP}/v1", PLURAL, {"metadata": {"name": name}, "spec": {}})
        created = custom.create_cluster_custom_object(
            GROUP, "v1", PLURAL, {"metadata": {"name": "d", "labels": {"x": "y"}}}
        )
        assert created["kind"] == "DeviceTaintRule" and "namespace" not in created["metadata"]
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

"""The test kit's helpers: pod_device_health, make_settings, socket_dir and PodStore."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import kubernetes.client
import pytest

from kubelet_dra import DeviceKey, HealthStatus, PodHealthUpdate, Role
from kubelet_dra.status import podstatus
from kubelet_dra.testing import (
    PodStore,
    make_pod,
    make_settings,
    pod_device_health,
    socket_dir,
)

NOW = 1_800_000_000.0


def pod_with_health() -> dict[str, Any]:
    pod = make_pod("train", claims=["gpu"], containers=["init-free", "main"])
    statuses = pod["status"]["containerStatuses"]
    statuses[1]["allocatedResourcesStatus"] = [
        {
            "name": "claim:gpu/big",
            "resources": [
                {"resourceID": "gpu=0", "health": "Unhealthy", "message": "XID 79"},
                {"resourceID": "gpu=1", "health": "Healthy"},
            ],
        },
        # A device plugin's entry: not DRA health.
        {"name": "example.com/nic", "resources": [{"resourceID": "nic-0", "health": "Healthy"}]},
    ]
    pod["status"]["conditions"].append(
        {"type": "DeviceHealthy", "status": "False", "reason": "DeviceUnhealthy"}
    )
    return pod


def test_pod_device_health_reads_claim_entries_and_the_condition() -> None:
    health = pod_device_health(pod_with_health())
    assert [tuple(e) for e in health.entries] == [
        ("main", "gpu/big", "gpu=0", "Unhealthy", "XID 79"),
        ("main", "gpu/big", "gpu=1", "Healthy", ""),
    ]
    assert health.by_resource == {"gpu=0": "Unhealthy", "gpu=1": "Healthy"}
    assert health.of("gpu=1") == "Healthy" and health.of("nic-0") is None
    assert health.condition_status == "False"
    assert pod_device_health(pod_with_health(), condition_type="Other").condition is None


def test_pod_device_health_of_a_client_model_equals_that_of_the_dict() -> None:
    pod = pod_with_health()
    client: Any = kubernetes.client.ApiClient()
    model = client._ApiClient__deserialize(pod, "V1Pod")  # what read_namespaced_pod returns
    assert pod_device_health(model) == pod_device_health(pod)


def test_pod_device_health_of_a_pod_without_status() -> None:
    health = pod_device_health({"metadata": {"name": "p"}, "status": None})
    assert health.entries == () and health.condition_status is None


def test_make_settings_roots_every_path_and_ignores_the_environment(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", "/somewhere/real-cluster")
    monkeypatch.setenv("NODE_NAME", "prod-7")
    monkeypatch.setenv("KUBELET_DRA_STATE_DIR", "/var/lib/kubelet-dra-health")
    monkeypatch.setenv("KUBELET_DRA_HEALTH_TIMEOUT", "3")
    settings = make_settings(tmp_path, role=Role.OWNER)
    assert settings.plugins_registry == tmp_path / "reg" and settings.plugins_registry.is_dir()
    assert settings.state_dir == tmp_path / "state"
    assert settings.kubelet_root_dir is None and settings.kubeconfig is None
    assert settings.pod_resources_socket is None  # never the host kubelet's socket
    assert (settings.node_name, settings.health_timeout, settings.role) == (
        "node-1",
        30.0,
        Role.OWNER,
    )
    with pytest.raises(ValueError, match="no_such_field"):
        make_settings(tmp_path, no_such_field=1)


def test_socket_dir_is_short_and_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    # A macOS-like TMPDIR is too long for a 63-byte driver name's socket: /tmp instead.
    monkeypatch.setattr("tempfile.tempdir", "/tmp/" + "t" * 60)
    with socket_dir() as path:
        assert path.parent == pathlib.Path("/tmp")
        longest = path / "plugins" / ("d" * 63) / "dra.sock"
        assert len(os.fsencode(longest)) <= 107
        (path / "reg").mkdir()
    assert not path.exists()


def test_pod_store_merges_updates_into_its_copy() -> None:
    store = PodStore()
    pod = store.add(make_pod("train", claims=["gpu"]))
    assert pod["metadata"]["uid"] == "uid-train"
    state = podstatus.DeviceState(
        key=DeviceKey("gpu.example.com", "node-1", "gpu-0"),
        resource_id="gpu=0",
        claim_ref="gpu",
        health=HealthStatus.UNHEALTHY,
        message="XID 79",
    )
    entry = {
        "name": "claim:gpu",
        "resources": [{"resourceID": "gpu=0", "health": "Unhealthy", "message": "XID 79"}],
    }
    desired = podstatus.Desired(
        pod_uid="uid-train",
        containers={("containerStatuses", "main"): {"claim:gpu": entry}},
        condition=podstatus.build_condition("DeviceHealthy", [state]),
        devices=(state,),
    )
    store.on_status(PodHealthUpdate("uid-train", desired))
    store.on_status(PodHealthUpdate("uid-gone", desired))  # a pod it does not hold: recorded
    assert store.health("uid-train").by_resource == {"gpu=0": "Unhealthy"}
    assert store.health("uid-train").condition_status == "False"
    assert [u.pod_uid for u in store.updates] == ["uid-train", "uid-gone"]

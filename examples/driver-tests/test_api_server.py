"""A driver author's test against the API: the manager writes pod status as the kubelet does."""

import kubernetes
import pytest

from kubelet_dra import DRAHealthManager
from kubelet_dra.testing import (
    Container,
    PodClaim,
    eventually,
    make_claim,
    make_pod,
    pod_device_health,
)

DRIVER = "gpu.example.com"


@pytest.mark.kdra_driver(name=DRIVER, health_versions=("v1alpha1",))
async def test_the_status_the_kubelet_would_write(
    kdra_api, kdra_kube_client, kdra_settings, kdra_driver
):
    kdra_api.create_claim(make_claim("gpu", results=[(DRIVER, "node-1", "gpu-0", "gpu")]))
    kdra_api.create_pod(
        make_pod(
            "train",
            claims=[PodClaim("gpu")],
            containers=[Container("main", claims=["gpu"]), "sidecar"],
        )
    )
    await kdra_driver.set_health(
        {"pool": "node-1", "device": "gpu-0", "health": "Unhealthy", "message": "fan"}
    )
    async with DRAHealthManager(kdra_settings, api_client=kdra_kube_client):
        core = kubernetes.client.CoreV1Api(kdra_kube_client)

        def condition():
            # The official client's V1Pod reads as well as the dict the API sent.
            pod = core.read_namespaced_pod("train", "default")
            return pod_device_health(pod).condition_status

        await eventually(lambda: condition() == "False", what="the DeviceHealthy condition")
    health = pod_device_health(kdra_api.get_pod("default", "train"))
    assert [(e.container, e.claim, e.resource_id, e.health, e.message) for e in health.entries] == [
        ("main", "gpu", f"{DRIVER}/node-1/gpu-0", "Unhealthy", "fan")
    ]
    assert kdra_driver.calls["NodeWatchResources/v1alpha1"] == 1

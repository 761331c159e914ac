"""A node agent's test: a fake driver's reports reach its pod through the manager."""

from kubelet_dra import PreparedDevice
from kubelet_dra.testing import eventually, make_pod


async def test_an_xid_turns_the_pod_unhealthy(kdra_driver, kdra_manager, kdra_pods):
    pod = kdra_pods.add(make_pod("train-0", claims=["train-0-gpu"]))
    uid = pod["metadata"]["uid"]
    # What NodePrepareResources returned for the pod's claim; then the pod itself.
    kdra_manager.index.add_prepared_claim(
        namespace="default",
        name="train-0-gpu",
        devices=[PreparedDevice(kdra_driver.name, "node-1", "gpu-0", cdi_ids=("gpu=0",))],
        pod_uids=[uid],
    )
    kdra_manager.set_pod(pod)

    await kdra_driver.set_health({"pool": "node-1", "device": "gpu-0", "health": "Healthy"})
    # entries[0] is an IndexError until the first update: eventually takes it for "not yet".
    await eventually(lambda: kdra_pods.health(uid).entries[0].health == "Healthy")

    await kdra_driver.set_health(
        {"pool": "node-1", "device": "gpu-0", "health": "Unhealthy", "message": "XID 79"}
    )
    await eventually(lambda: kdra_pods.health(uid).of("gpu=0") == "Unhealthy")
    health = kdra_pods.health(uid)
    assert health.entries[0].message == "XID 79"
    assert health.condition_status == "False"
    # The manager played the kubelet: it answered the driver's registration.
    assert kdra_driver.notifications == [(True, "")]

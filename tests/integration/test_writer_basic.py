"""Status writes through the official client against FakeApiServer: the basics."""

from __future__ import annotations

from kubelet_dra.status import podstatus
from kubelet_dra.testing import eventually
from tests.integration import _kube_harness as h

H = h.H


async def test_unhealthy_device_shows_in_pod_status_and_condition() -> None:
    async with h.running() as t:
        t.pod_with_gpu("p1", "gpu-0", "gpu-1")
        await eventually(lambda: t.pods.claims_synced)
        t.report("gpu-0", H.UNHEALTHY, "ECC errors")
        t.report("gpu-1", H.HEALTHY)
        expected = {f"{h.DRV}/pool/gpu-0": "Unhealthy", f"{h.DRV}/pool/gpu-1": "Healthy"}
        await eventually(lambda: t.healths("p1") == expected)
        entry = t.entries("p1")[0]
        assert entry["name"] == "claim:gpu"
        assert {
            "resourceID": f"{h.DRV}/pool/gpu-0",
            "health": "Unhealthy",
            "message": "ECC errors",
        } in entry["resources"]
        cond = t.condition("p1")
        assert cond is not None
        assert (cond["status"], cond["reason"]) == ("False", podstatus.REASON_UNHEALTHY)


async def test_writes_only_on_real_difference_and_keeps_other_status() -> None:
    async with h.running() as t:
        t.pod_with_gpu("p1", "gpu-0")
        await eventually(lambda: t.pods.claims_synced)
        t.report("gpu-0", H.HEALTHY)
        await eventually(lambda: t.healths("p1") == {f"{h.DRV}/pool/gpu-0": "Healthy"})
        await h.settled(t)
        writes = len(t.server.status_writes())
        pod = t.server.get_pod("default", "p1")
        before = pod["status"]
        for _ in range(20):
            t.report("gpu-0", H.HEALTHY)  # lease renewals: no visible change
            t.writer.mark_dirty({pod["metadata"]["uid"]})
        await h.settled(t)
        assert len(t.server.status_writes()) == writes
        after = t.server.get_pod("default", "p1")["status"]
        assert [c["type"] for c in after["conditions"]][:5] == [
            c["type"] for c in before["conditions"]
        ][:5]
        assert after["containerStatuses"][0]["image"] == before["containerStatuses"][0]["image"]


async def test_pod_on_another_node_is_never_written() -> None:
    async with h.running() as t:
        t.pod_with_gpu("mine", "gpu-0")
        other = t.pod_with_gpu("theirs", "gpu-0", node="node-2")
        await eventually(lambda: t.pods.claims_synced)
        t.writer.mark_dirty({other["metadata"]["uid"]})
        t.report("gpu-0", H.UNHEALTHY)
        await eventually(lambda: bool(t.healths("mine")))
        await h.settled(t)
        assert t.server.status_writes(name="theirs") == []
        assert t.index.pod(other["metadata"]["uid"]) is None

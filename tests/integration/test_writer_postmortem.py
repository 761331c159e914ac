"""Terminated pods keep their devices' health at failure; Events on transitions; deadlines."""

from __future__ import annotations

from typing import Any

from kubelet_dra import models
from kubelet_dra.status import claims
from kubelet_dra.testing import eventually, fakeapi
from tests.integration import _kube_harness as h

H = h.H
CDI = "gpu.example.com/gpu=gpu-0"


def _failed(pod: dict[str, Any]) -> dict[str, Any]:
    pod["status"]["phase"] = "Failed"
    return pod


async def test_failed_pod_gets_health_at_failure_after_its_claim_is_gone() -> None:
    async with h.running() as t:
        # A node agent prepares the claim itself (CDI IDs known), as the kubelet does.
        pod = t.server.create_pod(fakeapi.make_pod("job-0", claims=["gpu"]))
        uid = pod["metadata"]["uid"]
        device = claims.PreparedDevice(h.DRV, "pool", "gpu-0", cdi_ids=(CDI,))
        t.writer.mark_dirty(
            t.index.add_prepared_claim(namespace="default", name="gpu", devices=[device]).pods
        )
        t.report("gpu-0", H.HEALTHY)
        await eventually(lambda: t.healths("job-0") == {CDI: "Healthy"})
        # The device fails, the pod fails with it, and the claim is unprepared at once.
        t.cache.update(h.DRV, [models.DeviceReport("pool", "gpu-0", H.UNHEALTHY, "Xid 79")],
                       now=t.clock.now())  # fmt: skip
        t.server.update_pod("default", "job-0", _failed)
        await eventually(lambda: t.writer.has_record(uid))
        t.writer.mark_dirty(t.index.remove_prepared_claim(namespace="default", name="gpu").pods)
        t.report("gpu-0", H.HEALTHY)  # the device recovers after the pod is gone
        await h.settled(t)
        assert t.healths("job-0") == {CDI: "Unhealthy"}
        cond = t.condition("job-0")
        assert cond is not None
        assert cond["status"] == "False"
        assert "Xid 79" in cond["message"]


async def test_terminated_records_are_bounded_and_expire() -> None:
    async with h.running(terminated_pod_max=1, terminated_pod_ttl=0.3) as t:
        uids = []
        for name in ("a", "b"):
            uids.append(t.pod_with_gpu(name, f"gpu-{name}")["metadata"]["uid"])
            t.server.update_pod("default", name, _failed)
        await eventually(lambda: t.writer.has_record(uids[1]))
        assert not t.writer.has_record(uids[0])
        assert t.writer.stats.postmortem_records == 1
        # Records are memory, not schedule: the first round after the TTL drops them.
        expires = t.clock.now() + 0.3
        await eventually(lambda: t.clock.now() > expires)
        t.report("gpu-b", H.HEALTHY)
        await eventually(lambda: not t.writer.has_record(uids[1]), timeout=3)


async def test_transitions_become_aggregated_rate_limited_events() -> None:
    async with h.running(event_interval=0.3) as t:
        t.pod_with_gpu("p1", "gpu-0")
        await eventually(lambda: t.pods.claims_synced)
        for health in (H.HEALTHY, H.UNHEALTHY, H.HEALTHY, H.UNHEALTHY, H.HEALTHY, H.UNHEALTHY):
            t.report("gpu-0", health)
            await eventually(lambda: str(health) in t.healths("p1").values())  # noqa: B023

        def unhealthy() -> list[dict[str, Any]]:
            return [e for e in t.server.events() if e["reason"] == "DeviceUnhealthy"]

        await eventually(lambda: bool(unhealthy()) and unhealthy()[0]["count"] == 3)
        assert len(unhealthy()) == 1  # one Event object, counted, not three
        healthy = [e for e in t.server.events() if e["reason"] == "DeviceHealthy"]
        assert len(healthy) == 1
        assert healthy[0]["involvedObject"]["name"] == "p1"
        # First sight of a Healthy device is no transition: two Healthy flips, not three.
        await eventually(lambda: [e["count"] for e in t.server.events()
                                    if e["reason"] == "DeviceHealthy"] == [2])  # fmt: skip

"""--container-status auto/on/off, kubelet coexistence, and the API server's gates."""

from __future__ import annotations

from typing import Any

from kubelet_dra import settings
from kubelet_dra.testing import eventually, fakeapi
from tests.integration import _kube_harness as h

H = h.H
AUTO, ON, OFF = (settings.ContainerStatusMode(m) for m in ("auto", "on", "off"))


async def _healthy_pod(t: h.Harness) -> None:
    t.pod_with_gpu("p1", "gpu-0")
    await eventually(lambda: t.pods.claims_synced)
    t.report("gpu-0", H.UNHEALTHY, "bad")
    await eventually(lambda: bool(t.healths("p1")) or t.writer.stats.gate_off)


async def _kubelet_rewrites(t: h.Harness, times: int) -> int:
    """Let the kubelet rewrite container statuses ``times`` times; our writes meanwhile."""
    before = len(t.server.status_writes(name="p1"))
    uid = t.server.get_pod("default", "p1")["metadata"]["uid"]
    for _ in range(times):
        rv = int(t.server.kubelet_write("default", "p1")["metadata"]["resourceVersion"])
        await eventually(lambda: _seen_rv(t, uid) >= rv)  # noqa: B023  # the watch delivered it
        await h.settled(t, quiet=0.08)
    return len(t.server.status_writes(name="p1")) - before


def _seen_rv(t: h.Harness, uid: str) -> int:
    pod = t.pods.get(uid) or {}
    return int((pod.get("metadata") or {}).get("resourceVersion") or 0)


async def test_auto_mode_stops_the_field_when_a_kubelet_rewrites_statuses_without_it() -> None:
    # A kubelet whose ResourceHealthStatus gate is off removes the field (issue 19): that is
    # no kubelet writing it, and the field stops for the node (test_writer_coexist.py).
    async with h.running(container_status=AUTO) as t:
        await _healthy_pod(t)
        await h.settled(t)
        # Writes over ten kubelet rewrites: at most the first one is answered.
        assert await _kubelet_rewrites(t, 10) <= 1
        assert t.writer.stats.kubelet_removes
        assert t.writer.stats.kubelet_owned_pods == 0
        cond = t.condition("p1")
        assert cond is not None
        assert cond["status"] == "False"  # the condition is still ours


async def test_on_mode_backs_off_after_a_kubelet_removes_the_field() -> None:
    # Not one rewrite per kubelet rewrite any more: the first waits 10 s (REMOVAL_BACKOFF_FIRST).
    async with h.running(container_status=ON) as t:
        await _healthy_pod(t)
        await h.settled(t)
        assert await _kubelet_rewrites(t, 3) == 0
        assert t.writer.stats.field_removals == 1
        assert t.healths("p1") == {}
        assert (t.condition("p1") or {}).get("status") == "False"


async def test_auto_mode_leaves_cdi_entries_of_a_health_aware_kubelet_alone() -> None:
    async with h.running(container_status=AUTO) as t:
        pod = t.pod_with_gpu("p1", "gpu-0")
        entry = {"name": "claim:gpu", "resources": [
            {"resourceID": "gpu.example.com/gpu=gpu-0", "health": "Healthy"}]}  # fmt: skip

        def kubelet(current: dict[str, Any]) -> list[dict[str, Any]]:
            statuses = fakeapi.fresh_container_statuses(current)
            statuses[0]["allocatedResourcesStatus"] = [entry]
            return statuses

        t.server.kubelet_write("default", "p1", kubelet)
        await eventually(lambda: t.pods.claims_synced)
        t.report("gpu-0", H.UNHEALTHY)
        await eventually(lambda: (t.condition("p1") or {}).get("status") == "False")
        await h.settled(t)
        assert t.entries("p1") == [entry]
        for record in t.server.status_writes(name="p1"):
            assert not _writes_container_status(record.body)
        assert t.writer.stats.kubelet_owned_pods == 1
        assert pod["metadata"]["uid"]


async def test_off_mode_writes_only_the_condition() -> None:
    async with h.running(container_status=OFF) as t:
        await eventually(lambda: True)
        t.pod_with_gpu("p1", "gpu-0")
        await eventually(lambda: t.pods.claims_synced)
        t.report("gpu-0", H.UNHEALTHY)
        await eventually(lambda: (t.condition("p1") or {}).get("status") == "False")
        assert t.entries("p1") == []


async def test_gate_off_is_detected_once_and_the_field_is_no_longer_sent() -> None:
    async with h.running(container_status=ON) as t:
        t.server.health_gate = False
        for n in range(3):
            t.pod_with_gpu(f"p{n}", f"gpu-{n}")
        await eventually(lambda: t.pods.claims_synced)
        for n in range(3):
            t.report(f"gpu-{n}", H.UNHEALTHY)
        await eventually(lambda: t.writer.stats.gate_off)
        await h.settled(t)
        writes = len(t.server.status_writes())
        for n in range(3):
            t.report(f"gpu-{n}", H.HEALTHY)
        await eventually(lambda: all((t.condition(f"p{n}") or {}).get("status") == "True"
                                       for n in range(3)))  # fmt: skip
        await h.settled(t)
        later = t.server.status_writes()[writes:]
        assert not any(_writes_container_status(r.body) for r in later)
        assert t.writer.stats.gate_off_detected == 1
        node_events = [e for e in t.server.events() if e["involvedObject"]["kind"] == "Node"]
        assert [e["reason"] for e in node_events] == ["ResourceHealthStatusDisabled"]


async def test_message_gate_off_stops_sending_messages_without_a_write_loop() -> None:
    async with h.running(container_status=ON) as t:
        t.server.message_gate = False
        await _healthy_pod(t)
        await h.settled(t)
        writes = len(t.server.status_writes())
        t.writer.mark_dirty(t.index.pod_uids())
        await h.settled(t)
        assert len(t.server.status_writes()) == writes
        assert t.writer.stats.message_gate_off


def _writes_container_status(ops: list[dict[str, Any]]) -> bool:
    """Whether a JSON patch changes any container status (tests do not count)."""
    return any(op["op"] != "test" and "ontainerStatuses" in op["path"] for op in ops)

"""The node's pods (field-selected watch) and their claims (one GET each) feed the index."""

from __future__ import annotations

from typing import Any

import pytest

from kubelet_dra.status import claims
from kubelet_dra.testing import eventually, fakeapi
from tests.integration import _kube_harness as h

H = h.H


async def _requests_for(pods: int, others: int) -> tuple[int, int, int]:
    """Start a sidecar on a node with ``pods`` pods and ``others`` claims elsewhere."""
    async with h.running() as t:
        for n in range(others):
            t.server.create_claim(
                fakeapi.make_claim(
                    f"other-{n}",
                    namespace=f"ns-{n % 7}",
                    results=[(h.DRV, "pool", f"x-{n}", "gpu")],
                )
            )
        for n in range(pods):
            t.pod_with_gpu(f"p{n}", f"gpu-{n}")
        await eventually(lambda: t.pods.claims_synced, timeout=10)
        # Each pod's devices read Unknown, so each pod gets one status write: wait for them
        # all before the quiet window (on a loaded machine a write can come after 0.15 s).
        await eventually(lambda: len(t.server.status_writes()) >= pods, timeout=10)
        await h.settled(t)
        claim_lists = t.server.count("GET", r"/resourceclaims$")
        claim_gets = t.server.count("GET", r"/resourceclaims/[^/]+$")
        return len(t.server.requests), claim_lists, claim_gets


async def test_api_load_grows_with_the_node_pods_not_the_cluster() -> None:
    bare, small, large = (
        await _requests_for(3, 0),
        await _requests_for(3, 30),
        await _requests_for(6, 60),
    )
    assert small == bare  # 10N claims in the cluster cost nothing
    assert small[1] == large[1] == 0  # never a claim list or watch
    assert (small[2], large[2]) == (3, 6)  # one GET per referenced claim
    # Per extra pod: its claim GET and one status write (its devices read Unknown).
    assert large[0] - small[0] == 2 * 3


async def test_template_claim_is_fetched_once_the_status_names_it() -> None:
    async with h.running() as t:
        t.server.create_claim(
            fakeapi.make_claim("p1-gpu-x1", results=[(h.DRV, "pool", "g", "gpu")])
        )
        pod = fakeapi.make_pod("p1", claims=[fakeapi.PodClaim("gpu", "p1-gpu-x1", template="t")])
        created = t.server.create_pod(pod)
        await eventually(lambda: t.pods.claims_synced)
        uid = created["metadata"]["uid"]
        assert [d.device for _, d in t.index.devices_of_pod(uid)] == ["g"]


async def test_unallocated_claim_is_read_again_until_allocated() -> None:
    async with h.running() as t:
        claim = fakeapi.make_claim("late", results=[(h.DRV, "pool", "g", "gpu")])
        allocation = claim["status"].pop("allocation")
        t.server.create_claim(claim)
        pod = t.server.create_pod(fakeapi.make_pod("p1", claims=[fakeapi.PodClaim("gpu", "late")]))
        await eventually(lambda: t.server.count("GET", r"/resourceclaims/late$") >= 1)
        # Read once, so synced; still read again, and said so (the conformance runner's
        # sidecar waits on it: generated-84 compared a pod before the claim's next GET).
        late = claims.ClaimKey("default", "late")
        await eventually(lambda: t.pods.claims_synced)
        assert t.pods.claims_fetching == {late}
        t.server.set_claim_status("default", "late", {"allocation": allocation})
        uid = pod["metadata"]["uid"]
        await eventually(lambda: bool(t.index.devices_of_pod(uid)))
        await eventually(lambda: not t.pods.claims_fetching)


async def test_deleted_pod_leaves_the_index_and_its_claims() -> None:
    async with h.running() as t:
        pod = t.pod_with_gpu("p1", "gpu-0")
        await eventually(lambda: t.pods.claims_synced)
        assert t.index.referenced_claims() == {claims.ClaimKey("default", "p1-gpu")}
        t.server.delete_pod("default", "p1")
        await eventually(lambda: t.index.pod(pod["metadata"]["uid"]) is None)
        assert t.index.referenced_claims() == frozenset()


@pytest.mark.parametrize("gone", [True, False], ids=["410-relist", "watch-ended"])
async def test_watch_loss_resumes_without_missing_pods(gone: bool) -> None:
    async with h.running() as t:
        t.pod_with_gpu("p1", "gpu-0")
        await eventually(lambda: t.pods.claims_synced)
        if gone:
            t.server.expire_history()
        t.server.end_watches()
        second = t.pod_with_gpu("p2", "gpu-1")
        await eventually(lambda: t.index.pod(second["metadata"]["uid"]) is not None)
        t.report("gpu-1", H.UNHEALTHY)
        await eventually(lambda: t.healths("p2") == {f"{h.DRV}/pool/gpu-1": "Unhealthy"})


async def test_pod_moving_off_the_selector_is_dropped() -> None:
    async with h.running() as t:
        pod = t.pod_with_gpu("p1", "gpu-0")
        await eventually(lambda: t.pods.claims_synced)

        def elsewhere(obj: dict[str, Any]) -> dict[str, Any]:
            obj["spec"]["nodeName"] = "node-2"
            return obj

        await h.settled(t)
        t.server.update_pod("default", "p1", elsewhere)
        await eventually(lambda: t.index.pod(pod["metadata"]["uid"]) is None)
        writes = len(t.server.status_writes(name="p1"))
        t.report("gpu-0", H.UNHEALTHY)
        t.writer.mark_dirty({pod["metadata"]["uid"]})
        await h.settled(t)
        assert len(t.server.status_writes(name="p1")) == writes


async def test_a_relist_keeps_the_pods_held_at_the_same_version() -> None:
    async with h.running() as t:
        same = t.pod_with_gpu("p1", "gpu-0")
        moved = t.pod_with_gpu("p2", "gpu-1")
        await eventually(lambda: t.pods.claims_synced)
        await h.settled(t)
        held = t.pods.get(same["metadata"]["uid"])
        assert held is not None
        # A change this node's watch does not see, then compaction: its watch gets 410.
        elsewhere = fakeapi.make_claim("elsewhere", results=[(h.DRV, "pool", "x", "gpu")])
        t.server.create_claim(elsewhere)
        t.server.expire_history()
        t.server.end_watches()
        changed = t.server.update_pod("default", "p2", _labelled)
        await eventually(lambda: _rv(t.pods.get(moved["metadata"]["uid"])) == _rv(changed))
        # The relist's copy of p1 carried the version we held: the object is ours still.
        assert t.pods.get(same["metadata"]["uid"]) is held


@pytest.mark.parametrize("page_size", [10, 0])
async def test_a_relist_reads_the_pods_a_page_at_a_time(page_size: int) -> None:
    async with h.running(pod_list_page_size=page_size) as t:
        made = [t.pod_with_gpu(f"p{n}", f"gpu-{n}") for n in range(25)]
        await eventually(lambda: t.pods.claims_synced, timeout=10)
        lists = [
            r.query for r in t.server.requests
            if r.method == "GET" and r.path == "/api/v1/pods" and r.query.get("watch") != "true"
        ]  # fmt: skip
        assert [q.get("limit") for q in lists] == (["10"] * 3 if page_size else [None])
        assert [bool(q.get("continue")) for q in lists] == [False, *[True] * (len(lists) - 1)]
        assert all(t.pods.get(p["metadata"]["uid"]) is not None for p in made)


async def test_pods_are_held_without_their_managed_fields() -> None:
    async with h.running() as t:
        pod = t.pod_with_gpu("p1", "gpu-0")
        await eventually(lambda: t.pods.claims_synced)
        t.server.update_pod("default", "p1", _managed)
        uid = pod["metadata"]["uid"]
        await eventually(lambda: (t.pods.get(uid) or {}).get("metadata", {}).get("labels"))
        held = t.pods.get(uid)
        assert held is not None and "managedFields" not in held["metadata"]
        t.report("gpu-0", H.UNHEALTHY)
        await eventually(lambda: t.healths("p1") == {f"{h.DRV}/pool/gpu-0": "Unhealthy"})
        state = t.writer.state(uid)
        assert state is not None and "managedFields" not in state.pod["metadata"]
        assert t.server.get_pod("default", "p1")["metadata"]["managedFields"]


def _rv(obj: Any) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion"))


def _labelled(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"].setdefault("labels", {})["changed"] = "yes"
    return obj


def _managed(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["managedFields"] = [
        {"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}
    ]
    return _labelled(obj)

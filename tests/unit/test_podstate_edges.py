"""Edges of the writer's pod bookkeeping found by mutation testing.

A planned rewrite of a pod that is already dirty, the count of pending pods once a
deferred pod is written or dropped, the order of the in-flight record when a write
sends entries again, and the verdict on a pod with more than one managed container.
"""

from __future__ import annotations

from typing import Any

from kubelet_dra.kube import podstate
from kubelet_dra.status import claims, podstatus

WINDOW = 0.5


def pod(uid: str, rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": f"pod-{uid}", "resourceVersion": rv}}


# -- planned rewrites ------------------------------------------------------------------


def test_a_planned_rewrite_of_a_dirty_pod_keeps_the_earlier_time() -> None:
    states = podstate.PodStates()
    state = states.put(pod("a"))
    states.mark_dirty("a", 100.0, WINDOW)
    states.defer("a", 110.0)  # later than the change's time: the change's time stays
    assert state.due == 100.0 and states.next_due() == 100.0
    assert states.pending == 1  # a change still waits
    states.defer("a", 90.0)  # earlier: the rewrite comes sooner, still pending
    assert state.due == 90.0 and states.next_due() == 90.0
    assert states.pending == 1
    assert states.take_due(90.0) == ["a"] and states.pending == 0


def test_a_deferred_pod_written_is_no_longer_counted_apart() -> None:
    states = podstate.PodStates()
    states.put(pod("a"))
    states.put(pod("b"))
    states.defer("a", 10.0)
    assert states.take_due(10.0) == ["a"]
    assert states.pending == 0 and states.next_due() is None
    states.mark_dirty("b", 20.0, WINDOW)
    assert states.pending == 1  # b's change waits; a is no longer deferred


def test_a_deferred_pod_dropped_is_no_longer_counted_apart() -> None:
    states = podstate.PodStates()
    states.put(pod("a"))
    states.put(pod("b"))
    states.defer("a", 10.0)
    states.drop("a")
    assert states.pending == 0 and states.next_due() is None
    states.mark_dirty("b", 20.0, WINDOW)
    assert states.pending == 1


# -- the in-flight record ----------------------------------------------------------------

MAIN = (claims.CONTAINERS, "main")


def _entry(resource_id: str) -> dict[str, Any]:
    return {"name": "claim:gpu", "resources": [{"resourceID": resource_id, "health": "Healthy"}]}


def test_entries_sent_again_become_the_newest_and_outlive_older_ones() -> None:
    state = podstate.PodState(pod("a"))
    first = podstate.sent_entries(MAIN, [_entry("r0")])
    state.sent([first])
    for i in range(1, podstate.MAX_UNCONFIRMED):
        state.sent([podstate.sent_entries(MAIN, [_entry(f"r{i}")])])
    assert len(state.unconfirmed) == podstate.MAX_UNCONFIRMED
    state.sent([first])  # a retry sends r0 again: it is the newest now
    assert list(state.unconfirmed)[-1] == first
    assert len(state.unconfirmed) == podstate.MAX_UNCONFIRMED
    state.sent([podstate.sent_entries(MAIN, [_entry("new")])])  # the oldest goes: r1
    assert first in state.unconfirmed
    assert podstate.sent_entries(MAIN, [_entry("r1")]) not in state.unconfirmed


# -- who else writes the field, with two managed containers ------------------------------

FIRST = (claims.CONTAINERS, "first")  # sorted first in what we wrote
SECOND = (claims.CONTAINERS, "second")
OURS = _entry("d/p/gpu-0")
OTHER = {"name": "claim:gpu", "resources": [{"resourceID": "d/p/gpu-0", "health": "Unknown"}]}

V = podstate.Verdict


def _pod(rv: int, containers: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """A pod listing the given containers (name -> their entries), in that order."""
    statuses: list[dict[str, Any]] = []
    for name, entries in containers.items():
        cs: dict[str, Any] = {"name": name}
        if entries:
            cs["allocatedResourcesStatus"] = list(entries)
        statuses.append(cs)
    return {"metadata": {"uid": "a", "resourceVersion": str(rv)},
            "status": {"containerStatuses": statuses}}  # fmt: skip


def _desired() -> podstatus.Desired:
    return podstatus.Desired(
        "a", {FIRST: {"claim:gpu": OURS}, SECOND: {"claim:gpu": OURS}}, None, ()
    )


def _written() -> podstate.Written:
    answer = _pod(5, {"first": [OURS], "second": [OURS]})
    return podstate.Written(5, podstate.managed_entries(answer, _desired()))


def _verdict(later: dict[str, Any]) -> podstate.Verdict:
    return podstate.kubelet_verdict(_written(), later, _desired())


def test_a_change_in_a_later_container_counts_after_an_untouched_one() -> None:
    assert _verdict(_pod(6, {"first": [OURS], "second": [OTHER]})) is V.KUBELET_WRITES
    assert _verdict(_pod(6, {"first": [OURS], "second": []})) is V.KUBELET_REMOVES


def test_a_container_no_longer_listed_leaves_the_others_to_decide() -> None:
    # "first" is gone from the list (no evidence); "second" lost our entries: a removal.
    assert _verdict(_pod(6, {"second": []})) is V.KUBELET_REMOVES


def test_our_entries_kept_in_one_container_make_a_removal_elsewhere_a_write() -> None:
    # Removal needs every listed container to have lost our names; one kept them.
    assert _verdict(_pod(6, {"first": [OTHER], "second": []})) is V.KUBELET_WRITES
    assert _verdict(_pod(6, {"first": [], "second": [OTHER]})) is V.KUBELET_WRITES
    assert _verdict(_pod(6, {"first": [], "second": []})) is V.KUBELET_REMOVES

"""The writer's per-pod state: one object per pod, the leading-edge window, records, backoff."""

from __future__ import annotations

import random
from typing import Any

import pytest

from kubelet_dra import clock, models
from kubelet_dra.kube import podstate
from kubelet_dra.status import claims

WINDOW = 0.5


def pod(uid: str, rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": f"pod-{uid}", "resourceVersion": rv}}


def record(at: float, ttl: float = 60.0) -> podstate.PostMortem:
    return podstate.PostMortem(claims.FrozenClaims({}), {}, at, at + ttl)


def test_window_is_leading_edge_and_changes_coalesce() -> None:
    states = podstate.PodStates()
    state = states.put(pod("a"))
    states.mark_dirty("a", 100.0, WINDOW)
    assert state.due == 100.0  # never written: due at once
    assert states.take_due(100.0) == ["a"] and states.pending == 0
    state.last_write = 100.0
    states.mark_dirty("a", 100.1, WINDOW)
    assert state.due == 100.5  # written 0.1 s ago: a window after that write
    states.mark_dirty("a", 100.3, WINDOW)
    assert state.due == 100.5 and states.pending == 1  # coalesced, not pushed back
    assert states.take_due(100.4) == []
    assert states.next_due() == 100.5
    assert states.take_due(100.5) == ["a"]
    assert states.next_due() is None


def test_a_retry_replaces_the_due_time_and_unknown_pods_are_not_marked() -> None:
    states = podstate.PodStates()
    states.put(pod("a"))
    states.mark_dirty("a", 10.0, WINDOW)
    states.requeue("a", 40.0)
    assert states.next_due() == 40.0
    states.mark_dirty("ghost", 10.0, WINDOW)
    states.requeue("ghost", 11.0)
    assert "ghost" not in states and states.pending == 1


def test_a_new_copy_of_a_pod_keeps_its_state() -> None:
    states = podstate.PodStates()
    first = states.put(pod("a", "1"))
    first.failures = 2
    again = states.put(pod("a", "2"))
    assert again is first and again.pod["metadata"]["resourceVersion"] == "2"
    assert again.failures == 2


def test_dropping_a_pod_forgets_everything_kept_for_it() -> None:
    states = podstate.PodStates()
    state = states.put(pod("a"))
    states.mark_dirty("a", 1.0, WINDOW)
    states.set_record(state, record(1.0), limit=10)
    states.mark_kubelet_owned(state)
    state.seen_health[models.DeviceKey("d", "p", "x")] = models.HealthStatus.HEALTHY
    assert (states.pending, states.records, states.kubelet_owned) == (1, 1, 1)
    states.drop("a")
    assert states.get("a") is None and len(states) == 0
    assert (states.pending, states.records, states.kubelet_owned) == (0, 0, 0)
    fresh = states.put(pod("a"))
    assert fresh.seen_health == {} and fresh.record is None and not fresh.kubelet_owned


def test_records_are_bounded_oldest_first_and_expire() -> None:
    states = podstate.PodStates()
    for i, uid in enumerate("abc"):
        states.set_record(states.put(pod(uid)), record(float(i), ttl=10.0), limit=2)
    kept = {s.uid for s in states if s.record is not None}
    assert kept == {"b", "c"} and states.records == 2
    states.expire_records(10.5)  # b's (at 1 + 10) is not up yet
    assert states.records == 2
    states.expire_records(11.0)
    assert {s.uid for s in states if s.record is not None} == {"c"}
    states.expire_records(12.0)
    assert states.records == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_failure_backoff_doubles_to_a_cap_with_jitter(seed: int) -> None:
    rng = random.Random(seed)
    for streak in range(1, 10):
        base = min(podstate.FAILED_RETRY_MAX, 2.0 ** (streak - 1))
        assert 0.8 * base <= podstate.failure_backoff(streak, rng) <= 1.2 * base
    again = [podstate.failure_backoff(3, random.Random(seed)) for _ in range(2)]
    assert again[0] == again[1]  # the injected rng decides the jitter


def test_removal_backoff_doubles_from_ten_seconds_to_five_minutes() -> None:
    waits = [podstate.removal_backoff(n) for n in range(1, 10)]
    assert waits == [10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0, 300.0, 300.0]


def test_a_deferred_rewrite_is_due_but_not_pending() -> None:
    states = podstate.PodStates()
    states.put(pod("a"))
    states.defer("a", 110.0)
    assert states.pending == 0 and states.next_due() == 110.0  # planned, no change waits
    states.mark_dirty("a", 100.0, WINDOW)
    assert states.pending == 1 and states.next_due() == 100.0  # a change: pending again
    assert states.take_due(100.0) == ["a"] and states.pending == 0
    states.defer("a", 120.0)
    assert states.take_due(119.0) == [] and states.take_due(120.0) == ["a"]
    assert states.next_due() is None


# -- who else writes the field (issue 19) -----------------------------------------------

MAIN = (claims.CONTAINERS, "main")
OURS = {"name": "claim:gpu", "resources": [{"resourceID": "d/p/gpu-0", "health": "Healthy"}]}


def _pod(rv: int, *entries: dict[str, Any], listed: bool = True) -> dict[str, Any]:
    cs: dict[str, Any] = {"name": "main"}
    if entries:
        cs["allocatedResourcesStatus"] = list(entries)
    statuses = [cs] if listed else []
    return {"metadata": {"uid": "a", "resourceVersion": str(rv)},
            "status": {"containerStatuses": statuses}}  # fmt: skip


def _desired(entry: dict[str, Any] | None = OURS) -> Any:
    from kubelet_dra.status import podstatus

    return podstatus.Desired("a", {MAIN: {"claim:gpu": entry}}, None, ())


def _written(answer: dict[str, Any]) -> podstate.Written:
    rv = int(answer["metadata"]["resourceVersion"])
    return podstate.Written(rv, podstate.managed_entries(answer, _desired()))


V = podstate.Verdict
OTHER = {"name": "claim:gpu", "resources": [{"resourceID": "d/p/gpu-0", "health": "Unknown"}]}
CDI = {"name": "claim:gpu", "resources": [{"resourceID": "cdi.example/gpu=0", "health": "Healthy"}]}
PLUGIN = {"name": "nvidia.com/gpu", "resources": [{"resourceID": "GPU-1", "health": "Healthy"}]}
VERDICTS = [
    ("untouched", _pod(5, OURS), _pod(6, OURS), V.NOBODY),
    ("echo of our write", _pod(5, OURS), _pod(5), V.NOBODY),
    ("older version", _pod(5, OURS), _pod(4), V.NOBODY),
    ("ours changed", _pod(5, OURS), _pod(6, OTHER), V.KUBELET_WRITES),
    ("its own ids", _pod(5, OURS), _pod(6, CDI), V.KUBELET_WRITES),
    ("removed", _pod(5, OURS), _pod(6), V.KUBELET_REMOVES),
    ("removed, plugin kept", _pod(5, OURS, PLUGIN), _pod(6, PLUGIN), V.KUBELET_REMOVES),
    ("container not listed", _pod(5, OURS), _pod(6, listed=False), V.KUBELET_WRITES),
    ("dropped by the server", _pod(5), _pod(6), V.NOBODY),
    ("dropped, then written", _pod(5), _pod(6, CDI), V.KUBELET_WRITES),
]  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "later", "verdict"), [v[1:] for v in VERDICTS], ids=[v[0] for v in VERDICTS]
)
def test_kubelet_verdict_tells_writing_from_removing(
    answer: dict[str, Any], later: dict[str, Any], verdict: podstate.Verdict
) -> None:
    # ``answer`` is our write's answer (what the server kept), ``later`` a pod version after it.
    assert podstate.kubelet_verdict(_written(answer), later, _desired()) is verdict


def test_before_any_write_only_foreign_ids_tell_the_kubelet_writes() -> None:
    assert podstate.kubelet_verdict(None, _pod(3, CDI), _desired()) is V.KUBELET_WRITES
    assert podstate.kubelet_verdict(None, _pod(3, OTHER), _desired()) is V.NOBODY
    assert podstate.kubelet_verdict(None, _pod(3), _desired()) is V.NOBODY


def test_beside_a_kubelet_entries_we_did_not_write_are_the_kubelets() -> None:
    # With the kubelet's checkpoint our IDs equal its own: a restarted sidecar sees them.
    beside: dict[str, Any] = {"kubelet_beside": True}
    assert podstate.kubelet_verdict(None, _pod(3, OURS), _desired(), **beside) is V.KUBELET_WRITES
    assert podstate.kubelet_verdict(None, _pod(3, OTHER), _desired(), **beside) is V.KUBELET_WRITES
    assert podstate.kubelet_verdict(None, _pod(3, PLUGIN), _desired(), **beside) is V.NOBODY
    assert podstate.kubelet_verdict(None, _pod(3), _desired(), **beside) is V.NOBODY
    # Once we wrote, what we wrote is ours: an untouched field is nobody's.
    written = _written(_pod(5, OURS))
    assert podstate.kubelet_verdict(written, _pod(6, OURS), _desired(), **beside) is V.NOBODY


def test_a_second_change_before_the_due_time_keeps_the_earlier_time() -> None:
    states = podstate.PodStates()
    state = states.put(pod("a"))
    states.mark_dirty("a", 10.0, WINDOW)
    states.mark_dirty("a", 10.2, WINDOW)  # alone it would be due at 10.2
    assert state.due == 10.0


def test_a_known_pod_is_found_by_uid_and_an_unknown_one_dropped_quietly() -> None:
    states = podstate.PodStates()
    state = states.put(pod("a"))
    assert states.get("a") is state
    assert states.get("b") is None
    states.drop("b")  # never known: nothing to forget, no error
    assert len(states) == 1


def test_kubelet_owned_pods_are_counted_once_each() -> None:
    states = podstate.PodStates()
    a, b = states.put(pod("a")), states.put(pod("b"))
    states.mark_kubelet_owned(a)
    states.mark_kubelet_owned(b)
    states.mark_kubelet_owned(a)
    assert states.kubelet_owned == 2


def test_the_oldest_record_goes_first_not_the_oldest_pod() -> None:
    states = podstate.PodStates()
    first, second = states.put(pod("first")), states.put(pod("second"))
    states.set_record(second, record(1.0), limit=1)
    states.set_record(first, record(2.0), limit=1)  # beyond the limit: second's record goes
    assert first.record is not None and second.record is None


def test_entries_a_write_sent_are_ours_until_its_answer_comes() -> None:
    # Our write of OTHER was applied, its answer lost: the version showing it is ours.
    state = podstate.PodState(_pod(5, OURS))
    state.written = _written(_pod(5, OURS))
    state.sent([podstate.sent_entries(MAIN, [OTHER])])
    sent: dict[str, Any] = {"unconfirmed": state.unconfirmed}
    assert podstate.kubelet_verdict(state.written, _pod(6, OTHER), _desired(), **sent) is V.NOBODY
    assert podstate.kubelet_verdict(state.written, _pod(6, CDI), _desired(), **sent) is (
        V.KUBELET_WRITES
    )
    # A write that removed our entries, applied unanswered, is no removal by the kubelet.
    state.sent([podstate.sent_entries(MAIN, [])])
    assert podstate.kubelet_verdict(state.written, _pod(7), _desired(), **sent) is V.NOBODY
    # Before any answer, beside a kubelet: entries we sent are not the kubelet's.
    beside: dict[str, Any] = {"kubelet_beside": True, **sent}
    assert podstate.kubelet_verdict(None, _pod(3, OTHER), _desired(), **beside) is V.NOBODY
    assert podstate.kubelet_verdict(None, _pod(3, OURS), _desired(), **beside) is V.KUBELET_WRITES
    # An answer confirms what is there: the in-flight record goes.
    state.confirmed(_written(_pod(8, OTHER)))
    assert not state.unconfirmed and state.written.rv == 8


def test_the_in_flight_record_keeps_the_newest_entries_only() -> None:
    state = podstate.PodState(_pod(5))
    for i in range(podstate.MAX_UNCONFIRMED + 5):
        entry = {"name": "claim:gpu", "resources": [{"resourceID": f"r{i}", "health": "Healthy"}]}
        state.sent([podstate.sent_entries(MAIN, [entry])])
    assert len(state.unconfirmed) == podstate.MAX_UNCONFIRMED
    newest = {"name": "claim:gpu", "resources": [{"resourceID": "r20", "health": "Healthy"}]}
    assert list(state.unconfirmed)[-1] == podstate.sent_entries(MAIN, [newest])


# -- ``on`` beside a kubelet that rewrites the field (issue 39) --------------------------

CHIPS = {"name": "claim:gpu", "resources": [
    {"resourceID": f"d/p/tpu-{i}", "health": "Unhealthy" if i == 2 else "Healthy"}
    for i in range(4)]}  # fmt: skip
SHARED = {"name": "claim:gpu", "resources": [{"resourceID": "d/tpu=common", "health": "Healthy"}]}


def _chips_written(rv: int) -> podstate.Written:
    answer = _pod(rv, CHIPS)
    return podstate.Written(rv, podstate.managed_entries(answer, _desired(CHIPS)))


def test_a_shared_id_entry_in_place_of_ours_is_a_rewrite_by_the_kubelet() -> None:
    # We wrote one ID per chip; the kubelet (gate on) its one entry under the shared ID.
    state = podstate.PodState(_pod(5, CHIPS))
    state.confirmed(_chips_written(5))
    verdict = podstate.kubelet_verdict(state.written, _pod(6, SHARED), _desired(CHIPS))
    assert verdict is V.KUBELET_WRITES and state.rewritten(verdict)
    # Not a rewrite: nobody touched it, the echo of our write, or a removal.
    for later, other in (
        (_pod(6, CHIPS), V.NOBODY),
        (_pod(5), V.NOBODY),
        (_pod(6), V.KUBELET_REMOVES),
    ):
        assert podstate.kubelet_verdict(state.written, later, _desired(CHIPS)) is other
        assert not state.rewritten(other)


def test_before_our_first_write_the_kubelets_entry_is_no_rewrite() -> None:
    state = podstate.PodState(_pod(3, SHARED))
    verdict = podstate.kubelet_verdict(None, _pod(3, SHARED), _desired(CHIPS), kubelet_beside=True)
    assert verdict is V.KUBELET_WRITES and not state.rewritten(verdict)


def test_each_rewrite_backs_the_field_off_like_a_removal_on_a_fake_clock() -> None:
    fake = clock.FakeClock()
    state = podstate.PodState(_pod(5, CHIPS))
    rv, waits = 5, []
    for _ in range(8):
        state.confirmed(_chips_written(rv))  # our write, accepted
        verdict = podstate.kubelet_verdict(state.written, _pod(rv + 1, SHARED), _desired(CHIPS))
        assert state.rewritten(verdict)
        state.taken_back(fake.now())
        assert state.written is None and not state.rewritten(verdict)  # counted once
        assert state.rewrite_at is not None
        waits.append(state.rewrite_at - fake.now())
        fake.advance(waits[-1])
        rv += 2
    assert waits == [10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0, 300.0]
    assert state.takebacks == 8
    # Removals and rewrites share the one backoff: a removal next waits as long.
    state.taken_back(fake.now())
    assert state.rewrite_at == fake.now() + podstate.REMOVAL_BACKOFF_MAX

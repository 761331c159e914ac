"""The writer's per-pod state: one object per pod, the leading-edge window, records, backoff."""

from __future__ import annotations

import random
from typing import Any

import pytest

from kubelet_dra import claims, models
from kubelet_dra.kube import podstate

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

"""The taint bridge's pure decisions (``taints``) and its state file (``_taint_state``).

Time is a number passed in: thresholds, flapping and restarts are sequences of
``observe``/``step`` calls at chosen instants, no clock and no sleeping.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from kubelet_dra import metrics, models
from kubelet_dra.status.podjson import MutableObj
from kubelet_dra.taints import loop, planner, policy, statefile

H = models.HealthStatus
KEY = models.DeviceKey("gpu.example.com", "node-a", "gpu-0")
T0 = 1_700_000_000.0


def thresholds(**kw: object) -> policy.Thresholds:
    values: dict[str, Any] = {"effect": "NoSchedule", "key": "kubelet-dra.io/unhealthy"}
    values.update(kw)
    return policy.Thresholds(**values)


def run(
    timeline: list[tuple[float, H]], th: policy.Thresholds, until: float, tick: float = 0.5
) -> list[tuple[float, str | None]]:
    """Feed health changes at their times, stepping every ``tick``; the taint after each change
    of taint (time, value or None)."""
    track: policy.Track | None = None
    changes: list[tuple[float, str | None]] = []
    events = sorted(timeline)
    now, last = T0, None
    while now <= T0 + until:
        while events and T0 + events[0][0] <= now:
            track = policy.observe(track, events.pop(0)[1], now)
        if track is not None:
            track, _ = policy.step(track, th, now)
            value = track.taint.value if track.taint else None
            if value != last:
                changes.append((now - T0, value))
                last = value
        now += tick
    return changes


# -- thresholds ------------------------------------------------------------------------------


def test_unhealthy_for_taint_after_taints_once() -> None:
    changes = run([(0, H.UNHEALTHY)], thresholds(taint_after=10), until=100)
    assert changes == [(10.0, "Unhealthy")]


def test_taint_after_zero_taints_at_once() -> None:
    track = policy.observe(None, H.UNHEALTHY, T0)
    stepped, due = policy.step(track, thresholds(taint_after=0), T0, "XID 79")
    assert stepped.taint == policy.Taint("Unhealthy", T0, "XID 79")
    assert due is None


def test_step_reports_the_deadline() -> None:
    track = policy.observe(None, H.UNHEALTHY, T0)
    same, due = policy.step(track, thresholds(taint_after=10), T0 + 3)
    assert same is track
    assert due == T0 + 10


def test_healthy_for_untaint_after_untaints() -> None:
    changes = run(
        [(0, H.UNHEALTHY), (20, H.HEALTHY)], thresholds(taint_after=10, untaint_after=60), 200
    )
    assert changes == [(10.0, "Unhealthy"), (80.0, None)]


def test_untaint_after_zero() -> None:
    changes = run(
        [(0, H.UNHEALTHY), (20, H.HEALTHY)], thresholds(taint_after=0, untaint_after=0), 50
    )
    assert changes == [(0.0, "Unhealthy"), (20.0, None)]


def test_unknown_is_never_tainted_by_default() -> None:
    assert run([(0, H.UNKNOWN)], thresholds(), until=10_000, tick=50) == []


@pytest.mark.parametrize(("after", "expected"), [(0.0, 0.0), (30.0, 30.0)])
def test_taint_unknown_after(after: float, expected: float) -> None:
    assert run([(0, H.UNKNOWN)], thresholds(unknown_after=after), until=100) == [
        (expected, "Unknown")
    ]


def test_unknown_becomes_unhealthy_after_taint_after() -> None:
    changes = run(
        [(0, H.UNKNOWN), (40, H.UNHEALTHY)], thresholds(unknown_after=30, taint_after=10), 100
    )
    assert changes == [(30.0, "Unknown"), (50.0, "Unhealthy")]


def test_unknown_never_replaces_unhealthy_and_does_not_untaint() -> None:
    changes = run(
        [(0, H.UNHEALTHY), (20, H.UNKNOWN)], thresholds(taint_after=10, unknown_after=0), 500
    )
    assert changes == [(10.0, "Unhealthy")]


def test_upgrade_keeps_the_time_added() -> None:
    track = policy.Track(H.UNHEALTHY, T0, policy.Taint("Unknown", T0 - 100))
    stepped, _ = policy.step(track, thresholds(taint_after=10), T0 + 10, "now broken")
    assert stepped.taint == policy.Taint("Unhealthy", T0 - 100, "now broken")


# -- flapping ----------------------------------------------------------------------------------


def flapping(period: float, first: H, second: H, count: int) -> list[tuple[float, H]]:
    return [(i * period, first if i % 2 == 0 else second) for i in range(count)]


def test_flapping_faster_than_taint_after_never_taints() -> None:
    timeline = flapping(5, H.UNHEALTHY, H.HEALTHY, 200)
    assert run(timeline, thresholds(taint_after=10), until=1000) == []


def test_flapping_faster_than_untaint_after_never_untaints() -> None:
    timeline = [(0, H.UNHEALTHY)] + [
        (20 + t, h) for t, h in flapping(30, H.HEALTHY, H.UNHEALTHY, 60)
    ]
    assert run(timeline, thresholds(taint_after=10, untaint_after=60), until=1800) == [
        (10.0, "Unhealthy")
    ]


def test_same_health_again_keeps_the_track() -> None:
    track = policy.observe(None, H.UNHEALTHY, T0)
    assert policy.observe(track, H.UNHEALTHY, T0 + 5) is track
    moved = policy.observe(track, H.HEALTHY, T0 + 5)
    assert moved.since == T0 + 5


def test_message_is_cut_and_never_rewrites() -> None:
    track = policy.observe(None, H.UNHEALTHY, T0)
    long = "é" * 400
    tainted, _ = policy.step(track, thresholds(taint_after=0), T0, long)
    assert tainted.taint is not None
    assert len(tainted.taint.message.encode()) <= policy.MESSAGE_MAX_BYTES
    assert tainted.taint.message.endswith("...")
    again, _ = policy.step(tainted, thresholds(taint_after=0), T0 + 1, "temperature 91C")
    assert again is tainted


# -- names -------------------------------------------------------------------------------------


def test_readable_name() -> None:
    assert planner.rule_name("node-a", KEY) == "node-a.gpu.example.com.node-a.gpu-0"


@pytest.mark.parametrize(
    "key",
    [
        models.DeviceKey("gpu.example.com", "a/b/c", "gpu-0"),  # slashes in pool names
        models.DeviceKey("gpu.example.com", "pool", "GPU_0"),  # not a DNS label
        models.DeviceKey("gpu.example.com", "pool", "-x-"),
        models.DeviceKey("gpu.example.com", "p" * 200, "d" * 60),  # too long
        models.DeviceKey("gpu.example.com", "pool", "ü"),
        models.DeviceKey("..", "..", ".."),
    ],
)
def test_names_are_valid_and_stable(key: models.DeviceKey) -> None:
    for hashed in (False, True):
        name = planner.rule_name("node-a", key, hashed=hashed)
        assert len(name) <= 253
        assert planner._DNS_SUBDOMAIN.fullmatch(name), name
        assert name == planner.rule_name("node-a", key, hashed=hashed)


def test_long_names_are_hashed_and_distinct() -> None:
    a = models.DeviceKey("gpu.example.com", "p" * 240, "gpu-0")
    b = models.DeviceKey("gpu.example.com", "p" * 240, "gpu-1")
    name_a, name_b = planner.rule_name("node-a", a), planner.rule_name("node-a", b)
    assert name_a != name_b
    assert len(name_a) == 253
    assert name_a[:200] == name_b[:200]  # the readable prefix, then the hash


def test_hashed_name_differs_from_readable() -> None:
    assert planner.rule_name("n", KEY, hashed=True) != planner.rule_name("n", KEY)
    # Names of different nodes or drivers that read alike are told apart by the hash.
    x = planner.rule_name("n.a", models.DeviceKey("b", "p", "d"), hashed=True)
    y = planner.rule_name("n", models.DeviceKey("a.b", "p", "d"), hashed=True)
    assert x != y


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("kubelet-dra.io/unhealthy", True),
        ("unhealthy", True),
        ("example.com/a_b.c-d", True),
        ("", False),
        ("/x", False),
        ("Example.com/x", False),
        ("x/" + "a" * 64, False),
        ("a b", False),
        ("x/-a", False),
    ],
)
def test_taint_keys(key: str, valid: bool) -> None:
    assert planner.valid_taint_key(key) is valid


def test_node_label_value_limit() -> None:
    assert planner.valid_label_value("node-a")
    assert not planner.valid_label_value("n" * 64)


# -- rule objects --------------------------------------------------------------------------------


def body(effect: str = "NoSchedule", value: str = "Unhealthy", added: float = T0) -> MutableObj:
    th = thresholds(effect=effect)
    return planner.rule_body("r", "node-a", KEY, policy.Taint(value, added, "msg"), th)


def test_rule_body_shape() -> None:
    rule = body()
    assert rule["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "kubelet-dra-health",
        "kubelet-dra.io/node": "node-a",
    }
    assert rule["metadata"]["annotations"]["kubelet-dra.io/message"] == "msg"
    assert rule["spec"] == {
        "deviceSelector": {"driver": KEY.driver, "pool": KEY.pool, "device": KEY.device},
        "taint": {
            "key": "kubelet-dra.io/unhealthy",
            "value": "Unhealthy",
            "effect": "NoSchedule",
            "timeAdded": "2023-11-14T22:13:20Z",
        },
    }
    assert planner.device_of(rule) == KEY


def test_differs_ignores_time_and_message() -> None:
    current = body(added=T0 + 99)
    current["metadata"]["annotations"]["kubelet-dra.io/message"] = "other"
    assert not planner.differs(current, body())
    assert planner.differs(body(effect="NoExecute"), body())
    assert planner.differs(body(value="Unknown"), body())


def test_updated_keeps_time_added_and_resource_version() -> None:
    current = body(added=T0 - 50)
    current["metadata"]["resourceVersion"] = "7"
    current["metadata"]["managedFields"] = [{"manager": "x"}]
    new = planner.updated(current, body(effect="NoExecute"))
    assert new["spec"]["taint"]["timeAdded"] == current["spec"]["taint"]["timeAdded"]
    assert new["spec"]["taint"]["effect"] == "NoExecute"
    assert new["metadata"]["resourceVersion"] == "7"
    assert "managedFields" not in new["metadata"]


@pytest.mark.parametrize(
    "selector",
    [None, {}, {"driver": "d", "pool": "p"}, {"driver": "d", "pool": "", "device": "x"}],
)
def test_device_of_needs_one_device(selector: object) -> None:
    assert planner.device_of({"spec": {"deviceSelector": selector}}) is None


def test_taint_from_rule() -> None:
    taint = planner.taint_from_rule(body(value="Unknown"), T0 + 5)
    assert taint == policy.Taint("Unknown", T0, "msg")
    assert planner.taint_from_rule({}, T0).value == "Unhealthy"


# -- the state file --------------------------------------------------------------------------------


def test_state_round_trip(tmp_path: pathlib.Path) -> None:
    state = statefile.TaintStateFile(tmp_path)
    tracks = {
        KEY: policy.Track(H.UNHEALTHY, T0, policy.Taint("Unhealthy", T0 + 10, "x")),
        models.DeviceKey("d", "p/q", "e"): policy.Track(H.UNKNOWN, T0 + 1),
    }
    state.save(tracks)
    assert state.load() == tracks
    assert (tmp_path / "taints.json").stat().st_mode & 0o777 == 0o600
    assert not list(tmp_path.glob("*.tmp"))


def test_missing_state_is_empty(tmp_path: pathlib.Path) -> None:
    assert statefile.TaintStateFile(tmp_path / "none").load() == {}


@pytest.mark.parametrize(
    "content",
    [b"{", b"[]", b'{"format": 9, "devices": []}', b'{"format": 1, "devices": [{"x": 1}]}'],
)
def test_bad_state_is_set_aside(tmp_path: pathlib.Path, content: bytes) -> None:
    (tmp_path / "taints.json").write_bytes(content)
    assert statefile.TaintStateFile(tmp_path).load() == {}
    assert (tmp_path / "taints.bad").read_bytes() == content


def test_state_write_failure_is_a_store_error(tmp_path: pathlib.Path) -> None:
    from kubelet_dra import errors

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(errors.StoreError, match="not written"):
        statefile.TaintStateFile(blocker).save({KEY: policy.Track(H.UNKNOWN, T0)})


def test_state_file_is_json(tmp_path: pathlib.Path) -> None:
    statefile.TaintStateFile(tmp_path).save({KEY: policy.Track(H.UNKNOWN, T0)})
    doc = json.loads((tmp_path / "taints.json").read_text())
    assert doc == {
        "format": 1,
        "devices": [{"device": list(KEY), "health": "Unknown", "since": T0}],
    }


def test_updated_restores_our_labels_and_keeps_everyone_elses() -> None:
    current = body()
    current["metadata"]["labels"] = {"team": "infra", "kubelet-dra.io/node": "stale"}
    new = planner.updated(current, body())
    assert new["metadata"]["labels"] == {
        "team": "infra",
        "app.kubernetes.io/managed-by": "kubelet-dra-health",
        "kubelet-dra.io/node": "node-a",
    }
    unlabelled = body()
    del unlabelled["metadata"]["labels"]
    labels = body()["metadata"]["labels"]
    assert planner.updated(unlabelled, body())["metadata"]["labels"] == labels


# -- the plan ------------------------------------------------------------------------------


def _tainted(value: str = "Unhealthy") -> policy.Track:
    return policy.Track(H.UNHEALTHY, T0, policy.Taint(value, T0, "msg"))


def _rule(name: str, key: models.DeviceKey, value: str = "Unhealthy") -> MutableObj:
    taint = policy.Taint(value, T0, "msg")
    return planner.rule_body(name, "node-a", key, taint, thresholds(effect="NoSchedule"))


def test_plan_creates_updates_and_deletes_only_what_differs() -> None:
    other = models.DeviceKey("gpu.example.com", "node-a", "gpu-1")
    third = models.DeviceKey("gpu.example.com", "node-a", "gpu-2")
    fourth = models.DeviceKey("gpu.example.com", "node-a", "gpu-3")
    tracks = {KEY: _tainted(), other: _tainted(), third: _tainted(), fourth: _tracked_healthy()}
    rules = {
        "a-other": _rule("a-other", other, value="Unknown"),  # value changed: update
        "b-third": _rule("b-third", third),  # as wanted: nothing
        "c-third": _rule("c-third", third),  # a second rule of one device: delete
        "d-fourth": _rule("d-fourth", fourth),  # untainted: delete
    }
    ops = planner.plan(
        tracks, rules, node="node-a", thresholds=thresholds(effect="NoSchedule"),
        kubelet_id=str,
    )  # fmt: skip
    assert [type(op).__name__ for op in ops] == ["Create", "Update", "Delete", "Delete"]
    create, update, *deletes = ops
    assert isinstance(create, planner.Create) and create.key == KEY
    assert isinstance(update, planner.Update) and update.current is rules["a-other"]
    assert update.body["spec"]["taint"]["value"] == "Unhealthy"
    assert [d.rule for d in deletes if isinstance(d, planner.Delete)] == [
        rules["c-third"], rules["d-fourth"]
    ]  # fmt: skip


def _tracked_healthy() -> policy.Track:
    return policy.Track(H.HEALTHY, T0)


def test_adopted_takes_the_rule_taint_only_where_the_track_has_none() -> None:
    other = models.DeviceKey("gpu.example.com", "node-a", "gpu-1")
    rules = {"a": _rule("a", KEY, value="Unknown"), "b": _rule("b", other)}
    tracks = {other: _tainted()}
    found = planner.adopted(rules, tracks, health=lambda _k: H.UNHEALTHY, now=T0 + 5)
    assert list(found) == [KEY]
    track = found[KEY]
    assert track.health is H.UNHEALTHY and track.since == T0 + 5
    assert track.taint is not None and track.taint.value == "Unknown"


def test_bridge_states_are_the_metric_label_values() -> None:
    assert tuple(loop.BridgeState) == metrics.TAINT_STATES

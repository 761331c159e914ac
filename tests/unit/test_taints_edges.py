"""Edges of the taint bridge's policy and planner that mutation testing found unchecked.

Each test pins one boundary or default of ``policy`` (the cut of the driver's message,
the deadline of a pending upgrade) or ``planner`` (name limits, the readable and hashed
rule names, taint keys, the fields a rule is read and rebuilt from, timestamps in UTC,
adoption of rules after a lost state file) that ``test_taints.py`` leaves open.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubelet_dra import models
from kubelet_dra.status.podjson import MutableObj
from kubelet_dra.taints import planner, policy

H = models.HealthStatus
KEY = models.DeviceKey("gpu.example.com", "node-a", "gpu-0")
OTHER = models.DeviceKey("gpu.example.com", "node-a", "gpu-1")
T0 = 1_700_000_000.0


def thresholds(**kw: object) -> policy.Thresholds:
    values: dict[str, Any] = {"effect": "NoSchedule", "key": "kubelet-dra.io/unhealthy"}
    values.update(kw)
    return policy.Thresholds(**values)


def _rule(
    name: str, key: models.DeviceKey = KEY, value: str = "Unhealthy", *, kubelet_id: str = ""
) -> MutableObj:
    taint = policy.Taint(value, T0, "msg")
    return planner.rule_body(name, "node-a", key, taint, thresholds(), kubelet_id=kubelet_id)


# -- the policy ----------------------------------------------------------------------------


def test_message_of_exactly_the_limit_is_kept_whole() -> None:
    message = "a" * policy.MESSAGE_MAX_BYTES
    track = policy.observe(None, H.UNHEALTHY, T0)
    tainted, _ = policy.step(track, thresholds(taint_after=0), T0, message)
    assert tainted.taint is not None and tainted.taint.message == message


def test_cut_message_fills_the_limit() -> None:
    track = policy.observe(None, H.UNHEALTHY, T0)
    tainted, _ = policy.step(track, thresholds(taint_after=0), T0, "a" * 300)
    assert tainted.taint is not None
    assert tainted.taint.message == "a" * (policy.MESSAGE_MAX_BYTES - 3) + "..."


def test_step_without_a_message_records_none() -> None:
    track = policy.observe(None, H.UNHEALTHY, T0)
    tainted, _ = policy.step(track, thresholds(taint_after=0), T0)
    assert tainted.taint == policy.Taint("Unhealthy", T0, "")


def test_pending_upgrade_reports_its_deadline() -> None:
    track = policy.Track(H.UNHEALTHY, T0, policy.Taint("Unknown", T0 - 100))
    same, due = policy.step(track, thresholds(taint_after=10), T0 + 3)
    assert same is track
    assert due == T0 + 10


# -- names ---------------------------------------------------------------------------------


def test_pool_slashes_become_dots_in_the_readable_name() -> None:
    key = models.DeviceKey("gpu.example.com", "a/b", "gpu-0")
    assert planner.rule_name("node-a", key) == "node-a.gpu.example.com.a.b.gpu-0"


def test_readable_name_of_exactly_253_characters_is_kept() -> None:
    pool = "/".join(["p" * 63] * 3) + "/" + "p" * 32
    key = models.DeviceKey("gpu.example.com", pool, "gpu-0")
    name = planner.rule_name("node-a", key)
    assert len(name) == planner.NAME_MAX
    assert name == "node-a.gpu.example.com." + pool.replace("/", ".") + ".gpu-0"


def test_hashed_name_is_stable_across_versions() -> None:
    # A rule created by one version is found under the same name by the next.
    assert planner.rule_name("node-a", KEY, hashed=True) == (
        "node-a.gpu.example.com.node-a.gpu-0-0be33c7676"
    )


def test_name_with_nothing_readable_is_the_bare_hash() -> None:
    name = planner.rule_name("", models.DeviceKey("_", "_", "_"))
    assert name == "8409c41b8a"
    assert planner._DNS_SUBDOMAIN.fullmatch(name)


def test_node_label_value_of_63_characters_is_valid() -> None:
    assert planner.valid_label_value("n" * 63)


_PREFIX_253 = ".".join(["a" * 63] * 3) + "." + "a" * 61


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("x", True),
        ("a" * 63, True),
        ("example.com/" + "a" * 63, True),
        ("a" * 64, False),
        (_PREFIX_253 + "/x", True),
        (_PREFIX_253 + "a/x", False),
    ],
)
def test_taint_key_limits(key: str, valid: bool) -> None:
    assert planner.valid_taint_key(key) is valid


# -- rule objects --------------------------------------------------------------------------


def test_rule_body_without_kubelet_id_annotates_message_and_device_only() -> None:
    taint = policy.Taint("Unhealthy", T0, "msg")
    rule = planner.rule_body("r", "node-a", KEY, taint, thresholds())
    assert rule["metadata"]["annotations"] == {
        planner.MESSAGE_ANNOTATION: "msg",
        planner.DEVICE_ANNOTATION: str(KEY),
    }


@pytest.mark.usefixtures("far_time_zone")
def test_time_added_is_utc_whatever_the_local_zone() -> None:
    assert planner.rfc3339(T0) == "2023-11-14T22:13:20Z"
    assert planner.parse_rfc3339(planner.rfc3339(T0)) == T0


@pytest.mark.parametrize(
    "selector",
    [
        {"driver": 7, "pool": "p", "device": "x"},
        {"driver": "d", "pool": 7, "device": "x"},
        {"driver": "d", "pool": "p", "device": 7},
    ],
)
def test_device_of_needs_string_fields(selector: dict[str, object]) -> None:
    assert planner.device_of({"spec": {"deviceSelector": selector}}) is None


def test_is_ours_needs_metadata_and_both_labels() -> None:
    assert planner.is_ours(_rule("r"), "node-a")
    assert not planner.is_ours({}, "node-a")
    assert not planner.is_ours({"metadata": None}, "node-a")
    assert not planner.is_ours(_rule("r"), "node-b")
    foreign = _rule("r")
    foreign["metadata"]["labels"][planner.MANAGED_BY_LABEL] = "someone-else"
    assert not planner.is_ours(foreign, "node-a")


def test_effect_of_a_rule_without_one_is_empty() -> None:
    assert planner.effect_of({}) == ""
    assert planner.effect_of({"spec": {"taint": {"effect": None}}}) == ""
    assert planner.effect_of(_rule("r")) == "NoSchedule"


def test_differs_on_labels_and_selector() -> None:
    stale_node = _rule("r")
    stale_node["metadata"]["labels"][planner.NODE_LABEL] = "node-b"
    assert planner.differs(stale_node, _rule("r"))
    other_device = _rule("r")
    other_device["spec"]["deviceSelector"]["device"] = "gpu-9"
    assert planner.differs(other_device, _rule("r"))


def test_updated_merges_annotations() -> None:
    current = _rule("r")
    current["metadata"]["annotations"] = {
        "team.example.com/owner": "infra",
        planner.MESSAGE_ANNOTATION: "old",
    }
    desired = _rule("r", kubelet_id="cdi.example.com/gpu=0")
    assert planner.updated(current, desired)["metadata"]["annotations"] == {
        "team.example.com/owner": "infra",
        planner.MESSAGE_ANNOTATION: "msg",
        planner.DEVICE_ANNOTATION: str(KEY),
        planner.RESOURCE_ID_ANNOTATION: "cdi.example.com/gpu=0",
    }


def test_taint_from_rule_without_message_annotation_has_an_empty_message() -> None:
    rule = _rule("r")
    del rule["metadata"]["annotations"][planner.MESSAGE_ANNOTATION]
    assert planner.taint_from_rule(rule, T0 + 5) == policy.Taint("Unhealthy", T0, "")
    assert planner.taint_from_rule({}, T0).message == ""


# -- the plan ------------------------------------------------------------------------------


def test_plan_update_body_is_the_rule_under_its_current_name() -> None:
    taint = policy.Taint("Unhealthy", T0, "msg")
    tracks = {KEY: policy.Track(H.UNHEALTHY, T0, taint)}
    rules = {"r-a": _rule("r-a", value="Unknown")}
    ops = planner.plan(
        tracks, rules, node="node-a", thresholds=thresholds(),
        kubelet_id=lambda key: f"cdi.example.com/gpu={key.device}",
    )  # fmt: skip
    assert len(ops) == 1
    update = ops[0]
    assert isinstance(update, planner.Update) and update.current is rules["r-a"]
    assert update.body == planner.rule_body(
        "r-a", "node-a", KEY, taint, thresholds(), kubelet_id="cdi.example.com/gpu=gpu-0"
    )


# -- adoption ------------------------------------------------------------------------------


def _adopt(
    rules: dict[str, MutableObj], health: dict[models.DeviceKey, H] | None = None
) -> dict[models.DeviceKey, policy.Track]:
    healths = health or {KEY: H.UNHEALTHY, OTHER: H.UNHEALTHY}
    return planner.adopted(rules, {}, health=healths.__getitem__, now=T0 + 5)


def test_adopted_skips_a_rule_without_a_device_and_goes_on() -> None:
    found = _adopt({"a": {"spec": {"deviceSelector": {}}}, "b": _rule("b")})
    assert list(found) == [KEY]


def test_adopted_tracks_the_health_of_each_device() -> None:
    found = _adopt({"a": _rule("a"), "b": _rule("b", OTHER)}, {KEY: H.UNKNOWN, OTHER: H.HEALTHY})
    assert {key: track.health for key, track in found.items()} == {
        KEY: H.UNKNOWN,
        OTHER: H.HEALTHY,
    }


def test_adopted_rule_without_time_added_is_tainted_from_now() -> None:
    rule = _rule("a")
    del rule["spec"]["taint"]["timeAdded"]
    taint = _adopt({"a": rule})[KEY].taint
    assert taint is not None and taint.time_added == T0 + 5


def test_adopted_keeps_the_first_rule_of_a_device() -> None:
    found = _adopt({"a": _rule("a", value="Unknown"), "b": _rule("b", value="Unhealthy")})
    taint = found[KEY].taint
    assert taint is not None and taint.value == "Unknown"

"""The scenario language, the generator, the comparison rules and the committed matrix.

These need no Go and run in the default suite: every written scenario parses, mistakes get
one clear error naming the file and field, the generator is deterministic and covers what
the issue asks of it, the comparison explains differences as documented, and the matrix in
docs/conformance.md is the one the scenario files produce.
"""

from __future__ import annotations

import dataclasses
import pathlib
import types

import pydantic
import pytest

from tests.conformance import _compare, _generate, _matrix, _rules, _runner
from tests.conformance import _scenario as sc

WRITTEN = sc.load_all()
DELIBERATE = (
    "unknown-at-deadline",
    "terminated-pods",
    "rolling-upgrade",
    "init-containers",
    "lease-outlives-stream",
    "message-char-boundary",
    "no-dropped-notifications",
    "own-resource-ids",
)


def test_at_least_forty_written_scenarios_cover_every_deliberate_difference() -> None:
    assert len(WRITTEN) >= 40
    declared = {d.feature for s in WRITTEN for d in s.differences}
    assert set(DELIBERATE) <= declared
    # The kubelet drops notifications only while its sync loop is busy (pause_updates); with
    # an idle loop nothing is dropped, and flood-no-drops shows both sides the same.
    paused = [s for s in WRITTEN if any(step.kind == "pause_updates" for step in s.timeline)]
    assert {d.feature for s in paused for d in s.differences} >= {"no-dropped-notifications"}
    for drift in ("device-cap", "stale-deletion", "sorted-output", "registration-validation",
                  "null-maps"):  # fmt: skip
        assert drift in declared, drift


def test_every_upstream_test_of_the_reference_has_a_scenario() -> None:
    upstream = " ".join(s.upstream for s in WRITTEN)
    for name in (
        "TestNewHealthInfoCache", "TestGetHealthInfo", "TestGetHealthInfoRobust",
        "TestUpdateHealthInfo", "TestClearDriver", "HealthChangeForAllocatedDevice",
        "NonAllocatedDeviceChange", "NoActualStateChange", "StreamError", "ContextCanceled",
        "HealthChangeForDeviceWithShareID", "HealthChangeForMultiplePodsWithSharedDevice",
        "TestUpdateAllocatedResourcesStatus", "TestUpdateAllocatedResourcesStatus_Subrequest",
        "TestTruncateHealthMessage", "TestBuildResourceHealth", "TestToResourceHealthStatus",
        "TestToDeviceHealthStatus", "TestBuildDeviceHealth", "TestPlugin_WatchResources",
        "TestPlugin_WatchResources_V1Alpha1", "TestPickHealthService",
        "TestHealthStreamRequiresAdvertisedService", "TestUnimplementedHealthStreamIsNotRetried",
        "should reflect device health changes", "should update health to Unknown",
        "only serves the v1alpha1 health API", "only serves the v1 health API",
        "serves all health API versions",
    ):  # fmt: skip
        assert name in upstream, name


def _write(tmp_path: pathlib.Path, name: str, text: str) -> pathlib.Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


BASE = """
description: x
drivers: [{name: gpu.example.com}]
claims: [{name: c, devices: [{driver: gpu.example.com, device: d}]}]
pods: [{name: p, claims: [{name: gpu, claim: c}], containers: [{name: main, claims: [gpu]}]}]
"""


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("timeline: [{reprot: {driver: gpu.example.com}}]", "timeline[0]: unknown action 'reprot'"),
        ("timeline: [{report: {driver: gpu.exmple.com}}, {sync: a}]",
         "timeline[0] (report): unknown driver 'gpu.exmple.com'"),
        ("timeline: [{report: {driver: gpu.example.com}}]", "no sync point"),
        ("timeline: [{sync: a}, {sync: a}]", "sync point 'a' is used twice"),
        ("lines: [1.99]\ntimeline: [{sync: a}]", "unknown kubelet line '1.99'"),
        ("timeline: [{sync: a}]\ndifferences: [{feature: faster, kinds: [status]}]",
         "unknown feature 'faster'"),
        ("timeline: [{sync: a}]\ndifferences: [{feature: terminated-pods, kinds: [colour]}]",
         "unknown kind 'colour'"),
        ("timeline: [{sync: a}]\ndifferences: [{feature: terminated-pods, kinds: [status], "
         "at: [b], subject: pod p, field: entry claim:gpu, ours: null, twin: null}]",
         "unknown sync point 'b'"),
        ("timeline: [{sync: a}]\ndifferences: [{feature: terminated-pods, kinds: [status]}]",
         "difference terminated-pods: a declaration names where it shows; give at, subject, "
         "field (see 'Declared differences' in docs/conformance.md)"),
        ("timeline: [{sync: a}]\ndifferences: [{feature: terminated-pods, kinds: [status], "
         "at: [a], field: entry claim:gpu}]", "give subject"),
        ("timeline: [{wait: -1}, {sync: a}]", "timeline[0] (wait): seconds"),
        ("timeline: [{report: {driver: gpu.example.com, devices: [{health: Healthy}]}}, "
         "{sync: a}]", "needs `device`"),
        # The expected-failure mark is gone (issue 20): a file still carrying it is refused.
        ("timeline: [{sync: a}]\nknown_bug: stale", "known_bug"),
    ],
)  # fmt: skip
def test_mistakes_get_one_clear_error(tmp_path: pathlib.Path, extra: str, message: str) -> None:
    path = _write(tmp_path, "bad", BASE + extra)
    with pytest.raises(sc.ScenarioError) as caught:
        sc.load(path)
    assert str(caught.value).startswith("bad.yaml: ")
    assert message in str(caught.value)


GO = BASE.replace("{name: gpu.example.com}", "{name: gpu.example.com, implementation: go-helper}")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GO.replace("implementation: go-helper", "implementation: go-helper-v0.36")
         + "timeline: [{sync: a}]", "drivers.0.implementation"),
        (GO.replace("go-helper}", "go-helper, health_versions: [v1]}") + "timeline: [{sync: a}]",
         "health_versions cannot be chosen for implementation go-helper"),
        (GO + "timeline: [{end_stream: gpu.example.com}, {sync: a}]",
         "timeline[0] (end_stream): the Go helper driver cannot end a stream cleanly (EOF)"),
        (GO + "timeline: [{end_stream: {driver: gpu.example.com, code: DATA_LOSS}}, {sync: a}]",
         "code 'DATA_LOSS' is not one the Go helper driver knows"),
        (GO + "timeline: [{report: {driver: gpu.example.com, times: 3}}, {sync: a}]",
         "timeline[0] (report): the Go helper driver sends one report per control-file change"),
        (GO + "timeline: [{report: {driver: gpu.example.com, devices: [{device: d, "
         "health: 7}]}}, {sync: a}]", "health 7 cannot be scripted for the Go helper driver"),
        (GO.replace("claims: [{name: c,", "claims: [{name: c2, devices: [{driver: "
         "gpu.example.com, device: e}]}, {name: c,") + "timeline: [{sync: a}]",
         "answers every claim with one device list, but claims ['c', 'c2']"),
        (GO.replace("device: d}", "device: d, share_id: s}") + "timeline: [{sync: a}]",
         "share_id is not supported by the Go helper driver"),
        (GO.replace("device: d}", "device: d, returned: false}") + "timeline: [{sync: a}]",
         "must return at least one device per claim"),
    ],
)  # fmt: skip
def test_what_the_go_helper_driver_cannot_do_is_refused(
    tmp_path: pathlib.Path, text: str, message: str
) -> None:
    with pytest.raises(sc.ScenarioError) as caught:
        sc.load(_write(tmp_path, "bad", text))
    assert message in str(caught.value)


def test_go_helper_scenarios_cover_the_issue() -> None:
    helper = [s for s in WRITTEN if s.uses_go_helper()]
    assert len(helper) >= 5
    steps = {step.kind for s in helper for step in s.timeline}
    assert {"report", "end_stream", "restart", "prepare"} <= steps
    assert {d.implementation for s in helper for d in s.drivers} == {
        "go-helper", "go-helper-v0.35"
    }  # fmt: skip
    assert any(len(s.claims) > 1 for s in helper)
    assert any(r.args.devices and any(d.timeout for d in r.args.devices)
               for s in helper for r in s.timeline if isinstance(r.args, sc.Report))  # fmt: skip


def test_a_container_naming_an_unknown_claim_is_refused(tmp_path: pathlib.Path) -> None:
    text = BASE.replace("claims: [gpu]", "claims: [gpu, nic]") + "timeline: [{sync: a}]"
    with pytest.raises(sc.ScenarioError, match="uses claim 'nic'"):
        sc.load(_write(tmp_path, "bad", text))


def test_line_ranges() -> None:
    assert sc._expand_lines("<1.38") == ("1.34", "1.35", "1.36", "1.37")
    assert sc._expand_lines(">=1.37") == ("1.37", "1.38")
    assert sc._expand_lines("all") == sc.LINES


def test_generator_is_deterministic_and_covers_the_brief() -> None:
    scenarios = [_generate.scenario(seed) for seed in _generate.SEEDS]
    assert len(scenarios) >= 200
    assert _generate.scenario(17) == _generate.scenario(17)
    counts, timeouts, messages, ends = [], set(), [], 0
    for scenario in scenarios:
        for step in scenario.timeline:
            if isinstance(step.args, sc.Report):
                for device in step.args.devices:
                    counts.append(device.count)
                    if device.timeout:
                        timeouts.add(device.timeout)
                    message = device.message
                    messages.append(len(message.encode()) if isinstance(message, str) else 0)
            ends += isinstance(step.args, sc.EndStream)
    assert max(counts) > _generate.CAP  # crosses the kubelet's cap
    assert max(counts) <= 20_000
    assert timeouts == {1, 2, 3}
    assert 1024 < max(messages) <= 2050  # up to 2 kB
    assert ends >= 20
    assert {d.feature for s in scenarios for d in s.differences} >= {
        "unknown-at-deadline", "lease-outlives-stream", "message-char-boundary",
    }  # fmt: skip


def _result(name: str, pod: str = "p", ours: bool = True) -> _compare.Observed:
    return _compare.Observed("announced", f"sync {name}", f"pod {pod}", ours, not ours, "announced")


def _verdict(
    scenario: sc.Scenario, line: str, observed: list[_compare.Observed]
) -> _compare.Verdict:
    """classify as a run does: every observed difference was a comparison of the tally."""
    tally = _compare.Tally(_compare.declared_on(scenario, line), scenario)
    for o in observed:
        tally.compare(o.kind, o.at, o.subject, o.field, o.ours, o.twin)
    return _compare.classify(scenario, line, observed, tally=tally)


def test_classify_needs_every_difference_declared_and_every_declaration_seen() -> None:
    scenario = sc.Scenario.model_validate(
        {
            "name": "x",
            "description": "x",
            "drivers": [{"name": "d"}],
            "timeline": [{"sync": "a"}, {"sync": "b"}],
            "differences": [
                {"feature": "unknown-at-deadline", "kinds": ["announced"], "at": ["a"],
                 "subject": "pod p", "field": "announced", "ours": True, "twin": False},
                {"feature": "sorted-output", "lines": "<1.38", "kinds": ["status"], "at": "b",
                 "subject": "pod p containerStatuses[c]", "field": "entry claim:a order",
                 "ours": ["r1", "r2"], "twin": ["r2", "r1"]},
            ],
        }
    )  # fmt: skip
    verdict = _verdict(scenario, "1.38", [_result("a")])
    assert verdict.ok and [d.feature for d in verdict.seen] == ["unknown-at-deadline"]
    verdict = _verdict(scenario, "1.38", [_result("b")])
    assert verdict.unexplained == [_result("b")]
    assert [d.feature for d in verdict.missing] == ["unknown-at-deadline"]
    verdict = _verdict(scenario, "1.37", [_result("a")])
    assert [d.feature for d in verdict.missing] == ["sorted-output"]
    # Scoped: another pod, another side's value, another field are not covered.
    for other in (_result("a", pod="q"), _result("a", ours=False)):
        assert _verdict(scenario, "1.38", [_result("a"), other]).unexplained == [other]
    order = _compare.Observed("status", "sync b", "pod p containerStatuses[c]", [], [], "")
    health = dataclasses.replace(order, field="entry claim:a resource r1 health")
    assert _verdict(scenario, "1.37", [health]).unexplained == [health]


def test_blanket_declarations_load_only_to_measure_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sc, "ALLOW_BLANKET", True)
    old = sc.Difference(feature="sorted-output", kinds=("status",))
    assert old.blanket
    tally = _compare.Tally([old])
    for field in ("entry claim:a order", "entry claim:a resource r health"):
        tally.compare("status", "sync s", "pod p containerStatuses[c]", field, 1, 2)
    tally.compare("devices", "sync s", "d/pool/x", "health", "a", "b")
    assert (tally.total, tally.masked) == (3, [2])


def test_status_compares_each_entry_resource_and_field_on_its_own() -> None:
    r1 = {"resourceID": "r1", "health": "Healthy"}
    r2 = {"resourceID": "r2", "health": "Unhealthy", "message": "m"}
    a = {"name": "claim:a", "resources": [r1, r2]}
    b = {"name": "claim:b", "resources": [r1]}

    def status(*entries: object) -> dict[str, object]:
        return {"containerStatuses": [{"name": "c", "allocatedResourcesStatus": list(entries)}]}

    tally = _compare.Tally([])
    assert (
        _compare.compare_status("s", "p", status(a, b), status(a, b), ordered=True, tally=tally)
        == []
    )
    # entries order, claim:a order, 2 x 2 resource fields of claim:a, 2 of claim:b
    assert tally.total == 1 + 1 + 4 + 2
    swapped = {"name": "claim:a", "resources": [r2, r1]}
    found = _compare.compare_status("s", "p", status(a, b), status(swapped), ordered=False)
    assert [(o.field, o.ours, o.twin) for o in found] == [
        ("entry claim:a order", ["r1", "r2"], ["r2", "r1"]),
        ("entry claim:b", [r1], None),
    ]
    sick = {"name": "claim:a", "resources": [r1, {**r2, "message": "other"}]}
    found = _compare.compare_status("s", "p", status(a), status(sick), ordered=False)
    assert [(o.subject, o.field, o.ours, o.twin) for o in found] == [
        ("pod p containerStatuses[c]", "entry claim:a resource r2 message", "m", "other")
    ]


def test_announced_pods_are_compared_one_by_one() -> None:
    tally = _compare.Tally([])
    found = _compare.compare_announced(
        "s", {"a", "b"}, {"b", "c"}, ["a", "b", "c", "d"], tally=tally
    )
    assert [(o.subject, o.ours, o.twin) for o in found] == [
        ("pod a", True, False),
        ("pod c", False, True),
    ]
    assert tally.total == 4


def test_each_sides_announced_pods_are_compared_with_the_prediction() -> None:
    step = sc.Scenario.model_validate(
        {
            "name": "x", "description": "x", "drivers": [{"name": "d"}],
            "timeline": [{"sync": {"name": "a", "announced": {"ours": ["p"], "twin": []}}}],
        }
    ).timeline[0].args  # fmt: skip
    assert isinstance(step, sc.Sync) and step.announced is not None
    tally = _compare.Tally([])
    # Both sides agree, so compare_announced sees nothing; the model said otherwise.
    assert _compare.compare_announced("a", {"q"}, {"q"}, ["p", "q"], tally=tally) == []
    found = _compare.compare_predicted("a", {"q"}, {"q"}, step.announced, tally=tally)
    assert [(o.kind, o.subject, o.ours, o.twin) for o in found] == [
        ("predicted", "announced by ours", ["q"], ["p"]),
        ("predicted", "announced by twin", ["q"], []),
    ]
    assert 'predicted: ["p"]' in found[0].render()
    assert _compare.compare_predicted("a", {"p"}, set(), step.announced) == []
    # No declaration can cover a prediction that did not come true.
    with pytest.raises(ValueError, match="unknown kind 'predicted'"):
        sc.Difference.model_validate(
            {"feature": "x", "kinds": ["predicted"], "subject": "announced by ours",
             "field": "announced"}
        )  # fmt: skip


def test_every_generated_sync_point_carries_both_predicted_sets() -> None:
    for seed in (1, 2, 3):
        syncs = [s.args for s in _generate.scenario(seed).timeline if isinstance(s.args, sc.Sync)]
        assert syncs and all(s.announced is not None for s in syncs)


def test_status_order_counts_from_1_38_only() -> None:
    a = {"name": "claim:a", "resources": [{"resourceID": "r1", "health": "Healthy"}]}
    b = {"name": "claim:b", "resources": [{"resourceID": "r2", "health": "Healthy"}]}
    ours = {"containerStatuses": [{"name": "c", "allocatedResourcesStatus": [a, b]}]}
    twin = {"containerStatuses": [{"name": "c", "allocatedResourcesStatus": [b, a]}]}
    assert _compare.compare_status("s", "p", ours, twin, ordered=False) == []
    found = _compare.compare_status("s", "p", ours, twin, ordered=True)
    assert [(o.subject, o.field) for o in found] == [
        ("pod p containerStatuses[c]", "entries order")
    ]
    assert "--- twin (kubelet)" in found[0].render()


def _devices_scenario(count: int, **declared: object) -> sc.Scenario:
    devices = [f"d/pool/x{i}" for i in range(count)]
    return sc.Scenario.model_validate(
        {
            "name": "x", "description": "x", "drivers": [{"name": "d"}],
            "timeline": [{"sync": "a"}],
            "differences": [
                {"feature": "lease-outlives-stream", "kinds": ["devices"], "at": "a",
                 "subject": devices, "field": "health", **declared}
            ],
        }
    )  # fmt: skip


def test_a_declaration_is_checked_for_every_device_it_names() -> None:
    # Seen failing: with Count.failures counting a declaration held once any comparison
    # differed (the rule before), the one device that agreed passed.
    scenario = _devices_scenario(1000, ours="Healthy", twin="Unknown")
    tally = _compare.Tally(scenario.differences, scenario)
    for i in range(1000):
        tally.compare("devices", "a", f"d/pool/x{i}", "health", "Healthy", "Unknown")
    verdict = _compare.classify(scenario, "1.38", [], tally=tally)
    assert verdict.ok
    assert tally.counts[0].render() == "1000 in scope, 0 matched, 1000 differed"
    # One device of the thousand reads the same on both sides: its prediction failed.
    tally = _compare.Tally(scenario.differences, scenario)
    for i in range(1000):
        ours = "Unknown" if i == 500 else "Healthy"
        tally.compare("devices", "a", f"d/pool/x{i}", "health", ours, "Unknown")
    verdict = _compare.classify(scenario, "1.38", [], tally=tally)
    assert not verdict.ok and verdict.missing == list(scenario.differences)
    assert "1 comparisons in its scope agreed (first: at a: d/pool/x500 health)" in verdict.why[0]
    # A device it names that was never compared: not seen for that subject.
    tally = _compare.Tally(scenario.differences, scenario)
    for i in range(999):
        tally.compare("devices", "a", f"d/pool/x{i}", "health", "Healthy", "Unknown")
    verdict = _compare.classify(scenario, "1.38", [], tally=tally)
    assert "not seen at subjects d/pool/x999" in verdict.why[0]


def test_a_difference_with_other_values_is_undeclared() -> None:
    scenario = _devices_scenario(2, ours="Healthy", twin="Unknown")
    tally = _compare.Tally(scenario.differences, scenario)
    odd = _compare.Observed("devices", "a", "d/pool/x1", "Unhealthy", "Unknown", "health")
    tally.compare("devices", "a", "d/pool/x0", "health", "Healthy", "Unknown")
    tally.compare(odd.kind, odd.at, odd.subject, odd.field, odd.ours, odd.twin)
    verdict = _compare.classify(scenario, "1.38", [odd], tally=tally)
    assert verdict.unexplained == [odd]
    assert tally.counts[0].render() == "2 in scope, 0 matched, 1 differed, 1 otherwise"


def test_every_declaration_fixes_both_sides_or_names_a_rule() -> None:
    base = {"feature": "message-char-boundary", "kinds": ["devices"], "at": "a",
            "subject": "d/pool/x", "field": "message"}  # fmt: skip
    with pytest.raises(ValueError, match="fixes both sides' values; give ours"):
        sc.Difference.model_validate(base)
    with pytest.raises(ValueError, match="give twin"):
        sc.Difference.model_validate({**base, "ours": "m"})
    with pytest.raises(ValueError, match="unknown ours_rule"):
        sc.Difference.model_validate({**base, "ours_rule": "guess", "twin": ""})
    with pytest.raises(ValueError, match="not both"):
        sc.Difference.model_validate({**base, "ours_rule": "message-cut-bytes", "ours": ""})
    assert set(sc.RULE_NAMES) == set(_rules.RULES)
    assert all(len(d.fixed) + len(d.rules) == 2 for s in WRITTEN for d in s.differences)
    generated = _generate.scenario(7)
    assert all(len(d.fixed) == 2 for d in generated.differences)


def test_the_message_cut_rules() -> None:
    # Our cut keeps whole characters of the first 1,021 bytes; the kubelet's keeps the
    # bytes, and its JSON shows each byte of the split character as one U+FFFD.
    assert _rules.cut_at_character("é" * 600) == "é" * 510 + "..."
    assert _rules.cut_bytes("é" * 600) == "é" * 510 + "\ufffd..."
    assert _rules.cut_at_character("温" * 400) == "温" * 340 + "..."
    assert _rules.cut_bytes("温" * 400) == "温" * 340 + "\ufffd..."
    # 2 + 254 x 4 = 1,018 bytes, then 3 bytes of the next emoji: three U+FFFD.
    assert _rules.cut_bytes("xy" + "🙂" * 300) == "xy" + "🙂" * 254 + "\ufffd" * 3 + "..."
    assert _rules.cut_at_character("xy" + "🙂" * 300) == "xy" + "🙂" * 254 + "..."
    # No split, no difference; short messages are kept whole.
    assert _rules.cut_bytes("a" + "é" * 600) == _rules.cut_at_character("a" + "é" * 600)
    assert _rules.cut_bytes("a" * 1024) == "a" * 1024 == _rules.cut_at_character("a" * 1024)
    assert len(_rules.cut_bytes("a" * 1025).encode()) == 1024


def test_the_rules_read_the_reported_message_and_our_view() -> None:
    scenario = sc.Scenario.model_validate(
        {
            "name": "x", "description": "x", "drivers": [{"name": "d"}],
            "claims": [{"name": "c", "devices": [
                {"driver": "d", "device": "a", "request": "r"},
                {"driver": "d", "device": "b", "request": "s", "cdi": ["d/x=b"]},
                {"driver": "d", "device": "gone", "returned": False}]}],
            "pods": [{"name": "p", "claims": [{"name": "e", "claim": "c"}],
                      "containers": [{"name": "m", "claims": ["e", "e/s"]}]}],
            "timeline": [
                {"report": {"driver": "d", "devices": [
                    {"device": "b", "message": {"text": "é", "times": 600}}]}},
                {"sync": "one"},
                {"report": {"driver": "d", "devices": [{"device": "b", "message": "short"}]}},
                {"sync": "two"},
            ],
        }
    )  # fmt: skip

    def rule(
        name: str, kind: str, at: str, subject: str, field: str, view: object = None
    ) -> object:
        c = _rules.Comparison(scenario, kind, at, subject, field, view or {})  # type: ignore[arg-type]
        return _rules.RULES[name](c)

    cut = "message-cut-bytes"
    assert rule(cut, "devices", "one", "d/pool/b", "message") == "é" * 510 + "\ufffd..."
    assert rule(cut, "devices", "two", "d/pool/b", "message") == "short"
    status_field = "entry claim:e resource d/x=b message"  # by its CDI ID
    assert rule(cut, "status", "two", "pod p containerStatuses[m]", status_field) == "short"
    view = {("d", "pool", "a"): ("Healthy", ""), ("d", "pool", "b"): ("Unhealthy", "short")}
    entry = "entry-from-our-view"
    assert rule(entry, "status", "two", "pod p containerStatuses[m]", "entry claim:e", view) == [
        {"resourceID": "d/pool/a", "health": "Healthy"},
        {"resourceID": "d/x=b", "health": "Unhealthy", "message": "short"},
    ]
    assert rule(entry, "status", "two", "pod p containerStatuses[m]", "entry claim:e/s", view) == [
        {"resourceID": "d/x=b", "health": "Unhealthy", "message": "short"}
    ]
    with pytest.raises(ValueError, match="no sync point 'three'"):
        rule(cut, "devices", "three", "d/pool/b", "message")


def test_committed_matrix_is_the_one_the_scenarios_produce() -> None:
    committed = _matrix.section(_matrix.DOC.read_text(encoding="utf-8"))
    assert committed == _matrix.render(WRITTEN), (
        "docs/conformance.md is stale: run python -m tests.conformance._suite --write-matrix"
    )


def test_a_subject_range_names_each_device_and_nothing_else() -> None:
    diff = sc.Difference(
        feature="device-cap", kinds=("devices",), at=("s",),
        subject=("d/pool/dev-{3..5}",), field=("health",), ours="Unknown", twin="Healthy",
    )  # fmt: skip
    assert diff.subject == ("d/pool/dev-3", "d/pool/dev-4", "d/pool/dev-5")
    seen = _compare.Observed("devices", "sync s", "d/pool/dev-5", "Unknown", "Healthy", "health")
    assert _compare.covers(diff, seen)
    for other in ("d/pool/dev-6", "d/pool/dev-2", "d/pool/dev-"):
        assert not _compare.covers(diff, dataclasses.replace(seen, subject=other))
    with pytest.raises(pydantic.ValidationError, match="bad range"):
        sc.Difference(
            feature="device-cap", kinds=("devices",), at=("s",),
            subject=("x-{5..3}",), field=("health",),
        )  # fmt: skip


def test_lease_outlives_stream_declarations_are_scoped_with_both_values() -> None:
    by_name = {s.name: s for s in WRITTEN}
    for name in _matrix.LEASE_OUTLIVES_STREAM:
        for diff in by_name[name].differences:
            if diff.feature == "lease-outlives-stream":
                assert not diff.blanket and set(diff.fixed) == {"ours", "twin"}, diff.where()
    kept = _compare.Observed(
        "devices", "sync ended", "gpu.example.com/pool/dev-0", "Healthy", "Unknown", "health"
    )
    declared = _compare.declared_on(by_name["stream-eof"], "1.37")
    assert any(_compare.covers(d, kept) for d in declared)
    # Our side showing another value there (say, clearing the device at the stream end
    # as the kubelet does not) is not what is declared, nor is the same at another point.
    for other in (
        dataclasses.replace(kept, ours="Unhealthy"),
        dataclasses.replace(kept, at="sync healthy"),
    ):
        assert not any(_compare.covers(d, other) for d in declared)


def test_a_1_36_kubelet_streams_only_from_a_driver_serving_v1alpha1() -> None:
    health = ["v1.DRAPlugin", "v1.DRAResourceHealth"]
    assert _runner.twin_streams("1.36", health, ("v1", "v1alpha1"))
    assert not _runner.twin_streams("1.36", health, ("v1",))
    assert not _runner.twin_streams("1.37", ["v1.DRAPlugin"], ("v1", "v1alpha1"))
    assert _runner.twin_streams("1.37", health, ("v1",))


def test_a_declared_difference_past_the_first_twenty_is_kept_and_masked_once() -> None:
    # 30 devices differ (ours Healthy, the twin has none); only the last is declared. Kept
    # in order up to the limit, the 20 undeclared ones crowded it out and its declaration
    # read "declared but not seen" (generated-127's Unhealthy devices, past 16,000 others).
    scenario = sc.Scenario.model_validate(
        {
            "name": "x", "description": "x", "drivers": [{"name": "d"}],
            "timeline": [{"sync": "s"}],
            "differences": [
                {"feature": "lease-outlives-stream", "kinds": ["devices"], "at": ["s"],
                 "subject": "d/pool/dev-29", "field": "health",
                 "ours": "Healthy", "twin": "Unknown"},
            ],
        }
    )  # fmt: skip
    declared = _compare.declared_on(scenario, "1.38")
    tally = _compare.Tally(declared, scenario)
    ours = {("d", "pool", f"dev-{i}"): ("Healthy", "") for i in range(30)}
    found = _compare.compare_devices("sync s", ours, {}, tally=tally)
    late = _compare.Observed("devices", "sync s", "d/pool/dev-29", "Healthy", "Unknown", "health")
    assert late in found and len(found) == 21
    verdict = _compare.classify(scenario, "1.38", found, tally=tally)
    assert [d.feature for d in verdict.seen] == ["lease-outlives-stream"] and not verdict.missing
    assert len(verdict.unexplained) == 20
    # Each device's health and message compared once; the declaration masks one of them.
    assert (tally.total, tally.masked) == (60, [1])
    # The same declaration at another sync point covers nothing there.
    elsewhere = _compare.compare_devices("sync t", ours, {}, tally=tally)
    assert late.subject not in {o.subject for o in elsewhere} and tally.masked == [1]


def test_the_generator_counts_the_cap_on_each_side_after_a_stream_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A full driver's stream ends: the kubelet's clearDriver empties its cache, ours keeps
    # the leases. A new device then fits the kubelet's cap and not ours (generated-127,
    # dev-16571: ours Unknown, the twin Unhealthy, undeclared while the model counted the
    # kubelet's side only).
    monkeypatch.setattr(_generate, "CAP", 2)
    model = _generate._Model({("d", "dev-c"): {"pod-x"}})
    healthy = ("Healthy", "")
    model.report("d", [("dev-a", healthy, 30.0), ("dev-b", healthy, 30.0)], 0.0)
    model.sync(0.0)
    model.end("d", 1.0)
    model.report("d", [("dev-c", ("Unhealthy", "XID"), 30.0)], 2.0)
    differ = model.reads_differ(2.0)  # dev-a and dev-b: the leases we kept, as before
    assert differ[("d", "dev-c")] == (("Unknown", ""), ("Unhealthy", "XID"))
    ours, kubelet, causes = model.sync(2.0)
    assert (ours, kubelet) == (set(), {"pod-x"})
    assert causes == {"pod-x": {"lease-outlives-stream"}}


def test_every_generated_driver_past_the_cap_ends_its_stream_within_three_episodes() -> None:
    seen: list[int] = []
    for seed in _generate.SEEDS:
        scenario = _generate.scenario(seed)
        big = {
            step.args.driver
            for step in scenario.timeline
            if isinstance(step.args, sc.Report)
            and sum(d.count or 1 for d in step.args.devices) > _generate.CAP
        }
        if not big:
            continue
        seen.append(seed)
        ends = [s.args.driver for s in scenario.timeline if isinstance(s.args, sc.EndStream)]
        reports = sum(isinstance(s.args, sc.Report) for s in scenario.timeline)
        assert ends and ends[-1] in big, seed
        assert reports + len(ends) <= _generate.BIG_EPISODES + 1, seed
    assert seen == [7, 47, 87, 127, 167]  # the seeds with a driver past the cap


def _refusal(name: str, endpoint: str) -> str:
    """Our side's refusal text for a registration, from the real validation."""
    from kubelet_dra import errors
    from kubelet_dra.plugin import getinfo

    try:
        getinfo.make_plugin_info(name, endpoint, ["v1.DRAPlugin"])
    except errors.RegistrationError as exc:
        return str(exc)
    raise AssertionError(f"{name} at {endpoint} was accepted")


def test_a_refusal_on_both_sides_is_the_same_only_for_the_same_rule() -> None:
    # The kubelet's texts as its validation (v1.38) words them; ours from our validation.
    kubelet = {
        "driver name": "invalid DRA driver name: [a lowercase RFC 1123 subdomain must ...]",
        "endpoint not absolute": 'DRA plugin endpoint "x/dra.sock" must be an absolute path',
        "endpoint too long": 'DRA plugin endpoint "/a..." must not be longer than 108 bytes',
        "endpoint not plain": 'DRA plugin endpoint "/r/%2e%2e/d.sock" must be a plain path',
        "endpoint already registered": "endpoint /r/d.sock already registered for DRA driver "
        "plugin gpu.example.com",
    }
    ours = {
        "driver name": _refusal("gpu_example.com", "/r/d.sock"),
        "endpoint not absolute": _refusal("gpu.example.com", "x/dra.sock"),
        "endpoint too long": _refusal("gpu.example.com", "/" + "a" * 120),
        "endpoint not plain": _refusal("gpu.example.com", "/r/%2e%2e/d.sock"),
    }
    for rule, text in kubelet.items():
        assert _compare.refusal_rule(text) == rule
    for rule, text in ours.items():
        assert _compare.refusal_rule(text) == rule, text
    assert _compare.refusal_rule("connection refused").startswith("other: ")

    def compare(our_text: str | None, twin_error: str | None, refused: bool) -> list[str]:
        run = types.SimpleNamespace(tally=_compare.Tally([]), observed=[], at="step 0 (register)")
        twin = {"ok": twin_error is None, **({"error": twin_error} if twin_error else {})}
        _runner.Run._compare_registration(
            run,  # type: ignore[arg-type]  # the three attributes it reads
            "d", "/e", twin, our_text, refused=refused,
        )  # fmt: skip
        return [f"{o.field}: {o.ours} / {o.twin}" for o in run.observed]

    assert compare(ours["endpoint not plain"], kubelet["endpoint not plain"], True) == []
    assert compare(ours["driver name"], kubelet["endpoint not plain"], True) == [
        "reason: driver name / endpoint not plain"
    ]
    assert compare(ours["driver name"], kubelet["driver name"], False) == [
        "outcome: refused / refused"
    ]
    assert compare(None, None, False) == []


def test_entry_from_our_view_lists_resources_as_we_write_them() -> None:
    # As our entries read on 1.34 and 1.35 (measured): first CDI ID or
    # <driver>/<pool>/<device>, sorted by resourceID.
    scenario = sc.load(sc.SCENARIO_DIR / "cdi-resource-id.yaml")
    comparison = _rules.Comparison(
        scenario, "status", scenario.sync_names()[-1], "pod pod-a containerStatuses[main]",
        "entry claim:gpu",
    )  # fmt: skip
    resources = _rules.RULES["entry-from-our-view"](comparison)
    assert [r["resourceID"] for r in resources] == [
        "driver/class=b", "driver/pool/plain", "driver/pool=device",
    ]  # fmt: skip

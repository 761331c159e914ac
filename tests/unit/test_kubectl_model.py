"""The pure part of ``kubectl dra-health``: reading pods, resolving devices, taints, rows."""

from __future__ import annotations

import json

import pytest
import yaml

from kubelet_dra.kubectl import _model as model
from kubelet_dra.kubectl import _render as render
from kubelet_dra.status import claims
from kubelet_dra.testing import make_claim, make_pod
from kubelet_dra.testing.fakeapi import Container, PodClaim

D = "gpu.example.com"


def result(device: str, request: str = "gpus", pool: str = "pool") -> model.Result:
    return model.Result(D, pool, device, request)


def test_exact_resource_id_wins_over_everything() -> None:
    results = [result("a"), result("b")]
    assert model.resolve(f"{D}/pool/b", "claim:c", results) == (D, "pool", "b")
    # A pool may hold slashes: the whole ID is compared, not its parts.
    assert model.resolve(f"{D}/x/y/b", "claim:c", [result("b", pool="x/y")]) == (D, "x/y", "b")


def test_a_request_that_sees_one_device_resolves_any_id() -> None:
    results = [result("a", "first"), result("b", "second/sub")]
    assert model.resolve("vendor.com/gpu=opaque", "claim:c/second", results) == (D, "pool", "b")
    assert model.resolve("vendor.com/gpu=opaque", "claim:c/first", results) == (D, "pool", "a")
    assert model.resolve("vendor.com/gpu=opaque", "claim:c", results) is None


def test_cdi_names_ending_with_a_device_name_resolve_only_when_unique() -> None:
    results = [result("gpu-1"), result("gpu-11"), result("1")]
    assert model.resolve("v.com/gpu=uid-gpu-11", "claim:c", results) == (D, "pool", "gpu-11")
    # "uid-gpu-1" ends with "-gpu-1" and with "-1": two devices, no answer.
    assert model.resolve("v.com/gpu=uid-gpu-1", "claim:c", results) is None
    assert model.resolve("not-a-cdi-id", "claim:c", results) is None
    assert model.resolve("anything", "nvidia.com/gpu", []) is None


def _tpu_pod(message: str) -> model.PodView:
    pod = make_pod("p", claims=[PodClaim("tpu", "tpu-claim")])
    pod["status"]["conditions"] = [
        {
            "type": "DeviceHealthy",
            "status": "False",
            "reason": "DeviceUnhealthy",
            "message": message,
        }
    ]
    return model.pod_view(pod, "DeviceHealthy")


def test_our_condition_maps_cdi_ids_to_devices() -> None:
    view = _tpu_pod(
        "Unhealthy devices: tpu.google.com/node-a/chip-2 (as google.com/tpu=common, ours "
        "google.com/tpu=2) (claim tpu): ICI link down; gpu.example.com/x/y/gpu-0 "
        "(as vendor.com/gpu=gpu0) (claim tpu)"
    )
    chips = [model.Result("tpu.google.com", "node-a", f"chip-{i}", "") for i in range(4)]
    # Our own ID for the chip, and a plain CDI ID (its pool has a slash).
    assert model.resolve("google.com/tpu=2", "claim:tpu", chips, view) == (
        "tpu.google.com", "node-a", "chip-2",
    )  # fmt: skip
    assert model.resolve("vendor.com/gpu=gpu0", "claim:tpu", [], view) == (D, "x/y", "gpu-0")
    # The kubelet's one entry for four chips names no single device: no guess either.
    one = chips[:1]
    assert model.resolve("google.com/tpu=common", "claim:tpu", one, view) is None
    assert view.shared == {"google.com/tpu=common"}
    # Without our condition the guesses of before apply.
    assert model.resolve("google.com/tpu=common", "claim:tpu", one) == one[0].device_id


def test_a_kubelet_id_two_devices_claim_is_shared_and_odd_text_names_nothing() -> None:
    view = _tpu_pod("Unhealthy devices: d/p/a (as v/x=all) (claim c); d/p/b (as v/x=all) (claim c)")
    assert dict(view.named) == {}
    assert view.shared == frozenset({"v/x=all"})
    assert model.condition_names("All 4 devices are healthy") == ({}, frozenset())
    assert model.condition_names("d/p (as x) junk (as y, ours z") == ({}, frozenset())


def test_describe_says_why_a_shared_id_has_no_device() -> None:
    view = _tpu_pod("Unhealthy devices: d/p/a (as v/x=all, ours d/p/a) (claim tpu)")
    assert render._device_cell(None, "v/x=all", view) == "<shared by several devices>"
    assert render._device_cell(None, "v/x=other", view) == "<unresolved>"
    assert render._device_cell(("d", "p", "a"), "d/p/a", view) == "d/p/a"


def test_pod_view_reads_containers_sidecars_condition_and_claim_names() -> None:
    pod = make_pod(
        "p",
        claims=[PodClaim("ref", claim_name="object"), PodClaim("tpl", template="t")],
        containers=[Container("main", claims=["ref"])],
    )
    pod["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = [
        {"name": "claim:ref", "resources": [{"resourceID": "x", "health": "Bogus"}]},
        {"name": "nvidia.com/gpu", "resources": [{"resourceID": "GPU-1", "health": "Healthy"}]},
    ]
    pod["status"]["initContainerStatuses"] = [
        {
            "name": "side",
            "allocatedResourcesStatus": [
                {
                    "name": "claim:ref",
                    "resources": [{"resourceID": "y", "health": "Unhealthy", "message": "m"}],
                }
            ],
        }
    ]
    pod["status"]["conditions"].append(
        {
            "type": "DeviceHealthy",
            "status": "False",
            "reason": "DeviceUnhealthy",
            "lastTransitionTime": "2026-12-01T09:00:00Z",
        }
    )
    view = model.pod_view(pod, "DeviceHealthy")
    # A template's claim is named by the pod's status (resourceClaimStatuses).
    assert view.claims == {"ref": "object", "tpl": "tpl"}
    del pod["status"]["resourceClaimStatuses"]
    assert model.pod_view(pod, "").claims == {"ref": "object"}, "not created yet: unresolved"
    assert [(r.container, r.entry, r.health, r.message) for r in view.resources] == [
        ("main", "claim:ref", "Unknown", ""),
        ("main", "nvidia.com/gpu", "Healthy", ""),
        ("side", "claim:ref", "Unhealthy", "m"),
    ]
    assert view.claim_of("claim:ref/req") == ("default", "object")
    assert view.claim_of("nvidia.com/gpu") is None
    assert view.condition == model.Condition("False", "DeviceUnhealthy", "", "2026-12-01T09:00:00Z")
    assert model.pod_view(pod, "").condition is None


def test_a_device_row_takes_the_worst_health_and_every_user() -> None:
    claim = make_claim("c", results=[(D, "pool", "a", "gpus")])
    pods = []
    for name, health in (("p1", "Healthy"), ("p2", "Unknown"), ("p3", "Unhealthy")):
        pod = make_pod(name, claims=["c"])
        resources = [{"resourceID": f"{D}/pool/a", "health": health, "message": f"{name} says"}]
        pod["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = [
            {"name": "claim:c", "resources": resources}
        ]
        pods.append(model.pod_view(pod, ""))
    groups, count = model.device_groups(pods)
    assert list(groups) == [("node-1", f"{D}/pool/a")] and count == 1
    assert model.device_groups(pods, frozenset({"Unknown", "Healthy"})) == ({}, 1)
    assert model.device_groups(pods, frozenset({"Unhealthy"}))[0] == groups
    key, members = next(iter(groups.items()))
    results = {claims.ClaimKey("default", "c"): model.claim_results(claim)}
    row = model.device_row(key, members, results)
    assert (row.health, row.message, row.device) == ("Unhealthy", "p3 says", (D, "pool", "a"))
    assert [u.name for u in row.pods] == ["p1", "p2", "p3"] and row.claims == ["default/c"]
    assert model.worst([]) == "Healthy"


def test_taint_rules_match_on_what_can_be_evaluated() -> None:
    def rule(name: str, selector: object) -> dict[str, object]:
        spec: dict[str, object] = {"taint": {"key": name, "effect": "NoSchedule"}}
        if selector is not None:
            spec["deviceSelector"] = selector
        return {"metadata": {"name": name}, "spec": spec}

    rules = [
        rule("all", {}),
        rule("driver", {"driver": D}),
        rule("other-pool", {"pool": "other"}),
        rule("none", None),
        rule("class", {"deviceClassName": "gpu", "device": "a"}),
        rule("exact", {"driver": D, "pool": "pool", "device": "a"}),
    ]
    found = model.taints_for((D, "pool", "a"), rules)
    assert [t.rule for t in found] == ["all", "driver", "exact"]
    assert found[0] == model.Taint("all", None, "NoSchedule", "all")
    assert model.taints_for(None, rules) == []


def test_driver_filter_uses_the_resolved_driver_else_the_id_prefix() -> None:
    assert model.driver_matches(D, (D, "p", "d"), "v.com/x=y")
    assert not model.driver_matches("other", (D, "p", "d"), "other/p/d")
    assert model.driver_matches(D, None, f"{D}/p/d")
    assert not model.driver_matches(D, None, f"{D}x/p/d")


def test_json_built_item_by_item_is_json_dumps_text() -> None:
    rows = [
        model.DeviceRow(
            "n",
            "id/with\nnewline",
            "Unhealthy",
            'say "hi"\n',
            [model.PodUse("ns", "p", "c", None)],
            (D, "pool", "a"),
            [model.Taint("k", None, "None", "r")],
            ["ns/c"],
        ),
        model.DeviceRow("n", "x", "Healthy", "", [], None),
    ]
    for chosen in (rows, []):
        head, items = model.device_list(chosen)
        expected = json.dumps({**head, "items": list(model.device_list(chosen)[1])}, indent=2)
        assert render.document((head, items), "json") == expected + "\n"
    head, items = model.device_list(rows)
    assert (
        yaml.safe_load(render.document((head, items), "yaml"))["items"][0]["message"]
        == rows[0].message
    )


def test_the_condition_type_default_and_variable_are_the_sidecars(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kubelet_dra.kubectl import _cli
    from kubelet_dra.settings import Settings

    assert Settings().pod_condition_type == _cli.DEFAULT_CONDITION_TYPE
    monkeypatch.setenv(_cli.CONDITION_TYPE_VARIABLE, "example.com/Other")
    assert Settings().pod_condition_type == "example.com/Other"


def test_odd_shapes_in_a_status_are_skipped_not_fatal() -> None:
    pod = make_pod("p", claims=["c"])
    pod["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = [
        "not an object",
        {"name": "claim:c", "resources": {"resourceID": "x"}},
        {"name": "claim:c", "resources": [None, {"resourceID": "ok", "health": "Unhealthy"}]},
    ]
    pod["status"]["initContainerStatuses"] = "nonsense"
    view = model.pod_view(pod, "DeviceHealthy")
    assert [(r.resource_id, r.health) for r in view.resources] == [("ok", "Unhealthy")]

"""The status writer's patch planning: only our field, and tests of what it assumes.

Through ``kube.patchplan``'s public functions only: a pod, a ``podstatus.Desired``
and the clock's ``now`` in, the JSON patch and what it changes out.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubelet_dra.kube import patchplan
from kubelet_dra.status import claims, podstatus

ARS = "allocatedResourcesStatus"
NOW = 1_700_000_000.0
STAMP = podstatus.rfc3339(NOW)
COND = {"type": "DeviceHealthy", "status": "False", "reason": "DeviceUnhealthy", "message": "m"}


def pod(
    ars: list[dict[str, Any]] | None,
    conditions: list[dict[str, Any]] | None,
    *,
    uid: str = "u1",
) -> dict[str, Any]:
    main: dict[str, Any] = {"name": "main", "restartCount": 3}
    if ars is not None:
        main[ARS] = ars
    status: dict[str, Any] = {"containerStatuses": [{"name": "side"}, main]}
    if conditions is not None:
        status["conditions"] = conditions
    return {"metadata": {"uid": uid, "resourceVersion": "42"}, "status": status}


def entry(health: str, message: str = "") -> dict[str, Any]:
    resource = {"resourceID": "drv/pool/gpu-0", "health": health}
    if message:
        resource["message"] = message
    return {"name": "claim:gpu", "resources": [resource]}


def desired(
    gpu: dict[str, Any] | None = None,
    condition: dict[str, Any] | None = None,
    *,
    managed: bool = True,
) -> podstatus.Desired:
    """What we want: ``gpu`` is main's ``claim:gpu`` entry (``None``: it must go), unless
    main has no claims we manage."""
    entries: dict[str, dict[str, Any] | None] = {"claim:gpu": gpu}
    containers = {(claims.CONTAINERS, "main"): entries} if managed else {}
    return podstatus.Desired("u1", containers, condition, ())


def test_only_our_field_is_set_with_tests_of_index_and_old_value() -> None:
    current = pod([entry("Healthy")], [{"type": "Ready", "status": "True"}])
    plan = patchplan.plan(current, desired(entry("Unhealthy", "ECC")), now=NOW)
    assert plan is not None
    assert list(plan.ops) == [
        {"op": "test", "path": "/metadata/uid", "value": "u1"},
        {"op": "test", "path": "/status/containerStatuses/1/name", "value": "main"},
        {"op": "test", "path": f"/status/containerStatuses/1/{ARS}", "value": [entry("Healthy")]},
        {
            "op": "add",
            "path": f"/status/containerStatuses/1/{ARS}",
            "value": [entry("Unhealthy", "ECC")],
        },
    ]
    assert plan.containers == (
        patchplan.ContainerWrite(claims.CONTAINERS, 1, "main", (entry("Unhealthy", "ECC"),)),
    )
    assert plan.fields == {claims.CONTAINERS}
    assert plan.condition is None
    assert patchplan.assumptions_hold(current, plan.ops)


def test_nothing_to_change_plans_nothing() -> None:
    current = pod([entry("Healthy")], [{**COND, "lastTransitionTime": STAMP}])
    assert patchplan.plan(current, desired(entry("Healthy"), COND), now=NOW + 5) is None


def test_an_entry_left_without_devices_is_removed_under_a_test() -> None:
    current = pod([entry("Healthy")], None)
    plan = patchplan.plan(current, desired(None), now=NOW)
    assert plan is not None
    assert list(plan.ops[1:]) == [
        {"op": "test", "path": "/status/containerStatuses/1/name", "value": "main"},
        {"op": "test", "path": f"/status/containerStatuses/1/{ARS}", "value": [entry("Healthy")]},
        {"op": "remove", "path": f"/status/containerStatuses/1/{ARS}"},
    ]
    assert plan.containers[0].entries == ()


def test_switched_off_halves_are_not_planned() -> None:
    current = pod([entry("Healthy")], None)
    wanted = desired(entry("Unhealthy"), COND)
    only_condition = patchplan.plan(current, wanted, now=NOW, container_status=False)
    assert only_condition is not None and only_condition.containers == ()
    assert not any("containerStatuses" in op["path"] for op in only_condition.ops)
    only_containers = patchplan.plan(current, wanted, now=NOW, condition=False)
    assert only_containers is not None and only_containers.condition is None
    assert patchplan.plan(current, wanted, now=NOW, container_status=False, condition=False) is None


def test_a_container_status_that_does_not_exist_is_never_added() -> None:
    current = pod(None, None)
    absent = podstatus.Desired(
        "u1", {(claims.CONTAINERS, "gone"): {"claim:gpu": entry("Healthy")}}, None, ()
    )
    assert patchplan.plan(current, absent, now=NOW) is None


@pytest.mark.parametrize(
    "message",
    ["é", "XID 79 ✗", "🙂", "a<b", "a&b", "bell\x07"],
    ids=["utf8", "utf8-beyond-latin1", "astral", "lt", "amp", "ctl"],
)
def test_values_go_encodes_differently_are_guarded_by_resource_version(message: str) -> None:
    # The apiserver compares scalars by raw JSON text; these never match. Python's
    # json.dumps escapes every non-ASCII character (\u2717), Go keeps it as UTF-8: the
    # soak found "✗" (beyond Latin-1) tested as is, every change from it refused (422).
    current = pod([entry("Unhealthy", message)], [])
    plan = patchplan.plan(current, desired(entry("Healthy")), now=NOW)
    assert plan is not None
    assert {"op": "test", "path": "/metadata/resourceVersion", "value": "42"} in plan.ops
    assert not any(op["path"].endswith(ARS) and op["op"] == "test" for op in plan.ops)


OURS = {**COND, "lastTransitionTime": STAMP}


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        (
            [{"type": "Ready"}, {"type": "DeviceHealthy", "status": "True"}],
            [
                {"op": "test", "path": "/status/conditions/1/type", "value": "DeviceHealthy"},
                {"op": "replace", "path": "/status/conditions/1", "value": OURS},
            ],
        ),
        (
            [{"type": "Ready"}],
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                {"op": "add", "path": "/status/conditions/-", "value": OURS},
            ],
        ),
        (
            None,
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                {"op": "add", "path": "/status/conditions", "value": [OURS]},
            ],
        ),
    ],
    ids=["replace-at-tested-index", "append-guarded", "first-list-guarded"],
)
def test_condition_ops(
    conditions: list[dict[str, Any]] | None, expected: list[dict[str, Any]]
) -> None:
    plan = patchplan.plan(pod(None, conditions), desired(condition=COND, managed=False), now=NOW)
    assert plan is not None
    assert list(plan.ops[1:]) == expected
    assert plan.condition == OURS


def test_a_changed_pod_breaks_the_assumptions() -> None:
    current = pod([entry("Healthy")], [{"type": "DeviceHealthy"}])
    plan = patchplan.plan(current, desired(entry("Unhealthy"), COND), now=NOW)
    assert plan is not None
    assert patchplan.assumptions_hold(current, plan.ops)
    moved = pod([entry("Healthy")], [{"type": "Ready"}, {"type": "DeviceHealthy"}])
    assert not patchplan.assumptions_hold(moved, plan.ops)
    rewritten = pod([entry("Unknown")], [{"type": "DeviceHealthy"}])
    assert not patchplan.assumptions_hold(rewritten, plan.ops)
    replaced = pod([entry("Healthy")], [{"type": "DeviceHealthy"}], uid="u2")
    assert not patchplan.assumptions_hold(replaced, plan.ops)

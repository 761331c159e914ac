"""The status writer's JSON patch: only our field, and tests of what it assumes."""

from __future__ import annotations

from typing import Any

import pytest

from kubelet_dra.kube import writer as _kube_writer

ARS = "allocatedResourcesStatus"


def pod(
    ars: list[dict[str, Any]] | None, conditions: list[dict[str, Any]] | None
) -> dict[str, Any]:
    main: dict[str, Any] = {"name": "main", "restartCount": 3}
    if ars is not None:
        main[ARS] = ars
    status: dict[str, Any] = {"containerStatuses": [{"name": "side"}, main]}
    if conditions is not None:
        status["conditions"] = conditions
    return {"metadata": {"uid": "u1", "resourceVersion": "42"}, "status": status}


def entry(health: str, message: str = "") -> dict[str, Any]:
    resource = {"resourceID": "drv/pool/gpu-0", "health": health}
    if message:
        resource["message"] = message
    return {"name": "claim:gpu", "resources": [resource]}


def plan(
    current: dict[str, Any], new_ars: list[dict[str, Any]] | None, cond=None
) -> dict[str, Any]:
    statuses = [dict(cs) for cs in current["status"]["containerStatuses"]]
    if new_ars is not None:
        statuses[1][ARS] = new_ars
    status: dict[str, Any] = {"containerStatuses": statuses}
    if cond is not None:
        status["conditions"] = [cond]
    return {"status": status}


COND = {"type": "DeviceHealthy", "status": "False", "reason": "DeviceUnhealthy", "message": "m"}


def test_only_our_field_is_set_with_tests_of_index_and_old_value() -> None:
    current = pod([entry("Healthy")], [{"type": "Ready", "status": "True"}])
    ops = _kube_writer.json_patch(current, plan(current, [entry("Unhealthy", "ECC")]))
    assert ops == [
        {"op": "test", "path": "/metadata/uid", "value": "u1"},
        {"op": "test", "path": "/status/containerStatuses/1/name", "value": "main"},
        {"op": "test", "path": f"/status/containerStatuses/1/{ARS}", "value": [entry("Healthy")]},
        {
            "op": "add",
            "path": f"/status/containerStatuses/1/{ARS}",
            "value": [entry("Unhealthy", "ECC")],
        },
    ]
    assert _kube_writer.assumptions_hold(current, ops)


@pytest.mark.parametrize(
    "message", ["é", "a<b", "a&b", "bell\x07"], ids=["utf8", "lt", "amp", "ctl"]
)
def test_values_go_encodes_differently_are_guarded_by_resource_version(message: str) -> None:
    # The apiserver compares scalars by raw JSON text; these never match.
    current = pod([entry("Unhealthy", message)], [])
    ops = _kube_writer.json_patch(current, plan(current, [entry("Healthy")]))
    assert {"op": "test", "path": "/metadata/resourceVersion", "value": "42"} in ops
    assert not any(op["path"].endswith(ARS) and op["op"] == "test" for op in ops)


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        (
            [{"type": "Ready"}, {"type": "DeviceHealthy", "status": "True"}],
            [
                {"op": "test", "path": "/status/conditions/1/type", "value": "DeviceHealthy"},
                {"op": "replace", "path": "/status/conditions/1", "value": COND},
            ],
        ),
        (
            [{"type": "Ready"}],
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                {"op": "add", "path": "/status/conditions/-", "value": COND},
            ],
        ),
        (
            None,
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                {"op": "add", "path": "/status/conditions", "value": [COND]},
            ],
        ),
    ],
    ids=["replace-at-tested-index", "append-guarded", "first-list-guarded"],
)
def test_condition_ops(
    conditions: list[dict[str, Any]] | None, expected: list[dict[str, Any]]
) -> None:
    current = pod(None, conditions)
    ops = _kube_writer.json_patch(current, {"status": {"conditions": [COND]}})
    assert ops[1:] == expected


def test_a_changed_pod_breaks_the_assumptions() -> None:
    current = pod([entry("Healthy")], [{"type": "DeviceHealthy"}])
    ops = _kube_writer.json_patch(current, plan(current, [entry("Unhealthy")], COND))
    moved = pod([entry("Healthy")], [{"type": "Ready"}, {"type": "DeviceHealthy"}])
    assert not _kube_writer.assumptions_hold(moved, ops)
    rewritten = pod([entry("Unknown")], [{"type": "DeviceHealthy"}])
    assert not _kube_writer.assumptions_hold(rewritten, ops)


def test_transient_failures_of_one_pod_back_off_exponentially_with_a_cap() -> None:
    # An API outage must cost each pod fewer and fewer attempts, not one a second.
    from kubelet_dra import claims, clock, errors, settings
    from kubelet_dra.kube import api as _kube_api

    fake = clock.FakeClock()
    writer = _kube_writer.StatusWriter(
        api=None,  # type: ignore[arg-type]  # never called here
        node_name="n",
        index=claims.ClaimIndex(),
        health=lambda key, now: None,  # type: ignore[arg-type,return-value]
        config=settings.Settings(),
        clock=fake,
    )
    writer._pods["u1"] = pod(None, None)
    down = _kube_api.CallError("connection refused", status=None)
    delays = []
    for _ in range(8):
        writer._failed("u1", writer._pods["u1"], down)
        delays.append(writer._dirty["u1"] - fake.now())
    for n, delay in enumerate(delays):
        assert 0.8 * min(30.0, 2.0**n) <= delay <= 1.2 * min(30.0, 2.0**n)
    writer._accepted("u1", {"status": {}}, pod(None, None), None)  # type: ignore[arg-type]
    writer._failed("u1", writer._pods["u1"], down)
    assert writer._dirty["u1"] - fake.now() <= 1.2  # a success resets the streak
    assert isinstance(down, errors.ApiError)

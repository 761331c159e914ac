"""Pod status details the mutation run found unpinned: condition texts, times, defaults.

Each test pins one behaviour of ``podstatus`` that a surviving mutant of
``tox -e mutation`` changed without any other test noticing (docs/testing.md).
"""

from __future__ import annotations

from typing import Any

from kubelet_dra import models
from kubelet_dra.status import claims, podstatus
from tests.unit import _podstatus_builders as b

H = models.HealthStatus
DRV = "gpu.example.com"
TYPE = "DeviceHealthy"
ARS = "allocatedResourcesStatus"


def _key(device: str) -> models.DeviceKey:
    return models.DeviceKey(DRV, "pool", device)


def _pod_and_index(*devices: str, **pod_kwargs: Any) -> tuple[dict[str, Any], claims.ClaimIndex]:
    pod_kwargs.setdefault("containers", [b.container("main", ("gpu", ""))])
    pod_kwargs.setdefault("container_statuses", [{"name": "main"}])
    pod = b.pod(claims=[{"name": "gpu", "resourceClaimName": "gpu-claim"}], **pod_kwargs)
    index = claims.ClaimIndex()
    index.set_pod(pod)
    index.add_prepared_claim(
        namespace="default", name="gpu-claim",
        devices=[claims.PreparedDevice(DRV, "pool", d) for d in devices],
    )  # fmt: skip
    return pod, index


def _condition(table: dict[str, models.DeviceHealth]) -> dict[str, Any]:
    pod, index = _pod_and_index(*sorted(table))
    health = b.health_map({_key(d): r for d, r in table.items()})
    desired = podstatus.desired_status(
        pod, index=index, health_of=health, now=b.NOW, condition_type=TYPE
    )
    assert desired.condition is not None
    return desired.condition


# -- the condition's text ----------------------------------------------------------


def test_the_false_condition_lists_each_unhealthy_device_with_its_message_if_any() -> None:
    cond = _condition({"gpu-0": b.record(H.UNHEALTHY), "gpu-1": b.record(H.UNHEALTHY, "ECC")})
    assert cond["message"] == (
        f"Unhealthy devices: {DRV}/pool/gpu-0 (claim gpu); {DRV}/pool/gpu-1 (claim gpu): ECC"
    )


def test_the_unknown_condition_lists_the_devices_of_unknown_health() -> None:
    cond = _condition({"gpu-0": b.record(H.UNKNOWN), "gpu-1": b.record(H.HEALTHY)})
    assert (cond["status"], cond["reason"]) == ("Unknown", podstatus.REASON_UNKNOWN)
    assert cond["message"] == f"Health unknown for devices: {DRV}/pool/gpu-0 (claim gpu)"


def test_the_true_condition_counts_the_devices() -> None:
    cond = _condition({"gpu-0": b.record(H.HEALTHY), "gpu-1": b.record(H.HEALTHY)})
    assert cond == {
        "type": TYPE, "status": "True", "reason": podstatus.REASON_HEALTHY,
        "message": "All 2 devices are healthy",
    }  # fmt: skip


# -- the condition in a status -----------------------------------------------------


def test_a_condition_change_alone_is_a_change() -> None:
    pod, index = _pod_and_index("gpu-0")
    desired = podstatus.desired_status(
        pod, index=index, health_of=lambda _k: b.healthy(), now=b.NOW, condition_type=TYPE
    )
    new, changed = podstatus.merge(pod["status"], desired, now=b.NOW, container_status=False)
    assert changed
    assert podstatus.find_condition(new, TYPE) == {
        **(desired.condition or {}), "lastTransitionTime": podstatus.rfc3339(b.NOW)
    }  # fmt: skip


def test_a_condition_not_there_is_not_found() -> None:
    assert podstatus.find_condition({"conditions": [{"type": "Ready"}]}, TYPE) is None
    assert podstatus.find_condition(None, TYPE) is None


def test_last_transition_time_is_set_on_creation_and_moves_only_with_the_status() -> None:
    wanted = {"type": TYPE, "status": "False", "reason": "r", "message": "one"}
    created = podstatus.merged_condition(None, wanted, b.NOW)
    assert created == {**wanted, "lastTransitionTime": podstatus.rfc3339(b.NOW)}
    reworded = podstatus.merged_condition(created, {**wanted, "message": "two"}, b.NOW + 60)
    assert reworded is not None
    assert reworded["lastTransitionTime"] == podstatus.rfc3339(b.NOW)
    flipped = podstatus.merged_condition(created, {**wanted, "status": "True"}, b.NOW + 60)
    assert flipped is not None
    assert flipped["lastTransitionTime"] == podstatus.rfc3339(b.NOW + 60)
    untimed = {k: v for k, v in created.items() if k != "lastTransitionTime"}
    stamped = podstatus.merged_condition(untimed, {**wanted, "message": "two"}, b.NOW + 60)
    assert stamped is not None
    assert stamped["lastTransitionTime"] == podstatus.rfc3339(b.NOW + 60)


# -- the kubelet function's defaults and options --------------------------------------


def _update(pod: dict[str, Any], index: claims.ClaimIndex, **kw: Any) -> dict[str, Any]:
    table = {_key("gpu-0"): b.record(H.UNHEALTHY, "ECC")}
    return podstatus.update_allocated_resources_status(
        pod, pod["status"], index=index, health_of=b.health_map(table), now=b.NOW, **kw
    )


def test_the_kubelet_function_leaves_messages_out_when_asked() -> None:
    pod, index = _pod_and_index("gpu-0")
    [with_message] = podstatus.container_entries(_update(pod, index), claims.CONTAINERS, "main")
    assert with_message["resources"][0]["message"] == "ECC"
    new = _update(pod, index, with_message=False)
    [entry] = podstatus.container_entries(new, claims.CONTAINERS, "main")
    assert entry["resources"] == [{"resourceID": f"{DRV}/pool/gpu-0", "health": "Unhealthy"}]


def test_the_kubelet_function_covers_sidecars_by_default() -> None:
    pod, index = _pod_and_index(
        "gpu-0",
        containers=[{"name": "main"}],
        init_containers=[b.container("sidecar", ("gpu", ""), restart="Always")],
        init_container_statuses=[{"name": "sidecar"}],
    )
    entries = podstatus.container_entries(_update(pod, index), claims.INIT_CONTAINERS, "sidecar")
    assert [e["name"] for e in entries] == ["claim:gpu"]


def test_the_kubelet_function_sorts_a_managed_container_after_an_unmanaged_one() -> None:
    device_plugin = {"name": "a.example.com/gpu", "resources": [{"resourceID": "dp-0"}]}
    current = {"name": "claim:gpu", "resources": [
        {"resourceID": f"{DRV}/pool/gpu-0", "health": "Unhealthy", "message": "ECC"}
    ]}  # fmt: skip
    pod, index = _pod_and_index(
        "gpu-0",
        containers=[{"name": "plain"}, b.container("main", ("gpu", ""))],
        container_statuses=[{"name": "plain"}, {"name": "main", ARS: [current, device_plugin]}],
    )
    entries = podstatus.container_entries(_update(pod, index), claims.CONTAINERS, "main")
    assert [e["name"] for e in entries] == ["a.example.com/gpu", "claim:gpu"]


def test_the_comparable_form_keeps_every_field_and_reads_missing_ones_as_empty() -> None:
    entries: list[dict[str, Any]] = [
        {"name": "claim:b", "resources": [
            {"resourceID": "r1", "health": "Unhealthy", "message": "ECC"},
            {"resourceID": "r0", "health": "Healthy", "message": None},
        ]},
        {"resources": [{}]},  # nothing named: reads as empty text, not "None"
    ]  # fmt: skip
    assert podstatus.normalized(entries) == [
        ("", (("", "", ""),)),
        ("claim:b", (("r0", "Healthy", ""), ("r1", "Unhealthy", "ECC"))),
    ]

"""Pod status rules beyond the upstream tables: what is kept, what goes, sidecars, merging."""

from __future__ import annotations

from typing import Any

import pytest

from kubelet_dra import models
from kubelet_dra.status import claims, podstatus
from tests.unit import _podstatus_builders as b

H = models.HealthStatus
DRV = "gpu.example.com"
DEVICE_PLUGIN_ENTRY = {
    "name": "example.com/gpu",
    "resources": [{"resourceID": "dp-0", "health": "Healthy"}],
}


def _setup(
    *devices: claims.PreparedDevice, **pod_kwargs: Any
) -> tuple[dict[str, Any], claims.ClaimIndex]:
    pod_kwargs.setdefault("claims", [{"name": "gpu", "resourceClaimName": "gpu-claim"}])
    pod_kwargs.setdefault("containers", [b.container("main", ("gpu", ""))])
    pod_kwargs.setdefault("container_statuses", [{"name": "main", "ready": True}])
    pod = b.pod(**pod_kwargs)
    index = claims.ClaimIndex()
    index.set_pod(pod)
    index.add_prepared_claim(namespace="default", name="gpu-claim", devices=devices)
    return pod, index


def _dev(device: str, *cdi: str, requests: tuple[str, ...] = ()) -> claims.PreparedDevice:
    return claims.PreparedDevice(DRV, "pool", device, request_names=requests, cdi_ids=cdi)


def _key(device: str) -> models.DeviceKey:
    return models.DeviceKey(DRV, "pool", device)


def _update(pod: dict[str, Any], index: claims.ClaimIndex, table: Any = None, **kw: Any) -> Any:
    health = b.health_map(table) if table is not None else (lambda _k: b.healthy())
    kw.setdefault("now", b.NOW)
    return podstatus.update_allocated_resources_status(
        pod, pod["status"], index=index, health_of=health, **kw
    )


def test_first_cdi_device_id_is_the_resource_id() -> None:
    pod, index = _setup(_dev("gpu-0", "gpu.example.com/gpu=gpu-0", "other=1"))
    entries = podstatus.container_entries(_update(pod, index), claims.CONTAINERS, "main")
    assert entries[0]["resources"] == [
        {"resourceID": "gpu.example.com/gpu=gpu-0", "health": "Healthy"}
    ]


def test_devices_sharing_a_first_cdi_id_are_each_shown() -> None:
    # The kubelet would show one resource "same" for gpu-0 and gpu-1 (seenResourceIDs)
    # and hide the other's health; each gets an ID of its own instead (issue 19).
    pod, index = _setup(_dev("gpu-0", "same"), _dev("gpu-1", "same"), _dev("gpu-2"))
    table = {_key(f"gpu-{i}"): b.healthy() for i in range(3)}
    table[_key("gpu-1")] = b.record(H.UNHEALTHY, "ECC")
    entries = podstatus.container_entries(_update(pod, index, table), claims.CONTAINERS, "main")
    # No unique CDI ID: <driver>/<pool>/<device>; sorted by resourceID (kubelet v1.38).
    assert [(r["resourceID"], r["health"]) for r in entries[0]["resources"]] == [
        (f"{DRV}/pool/gpu-0", "Healthy"),
        (f"{DRV}/pool/gpu-1", "Unhealthy"),
        (f"{DRV}/pool/gpu-2", "Healthy"),
    ]


def test_a_shared_first_cdi_id_gives_way_to_the_per_device_one() -> None:
    # The Google TPU driver's answer: the claim-wide ID first, the chip's second.
    chips = [_dev(f"chip-{i}", "google.com/tpu=common", f"google.com/tpu={i}") for i in range(4)]
    pod, index = _setup(*chips)
    table = {_key(f"chip-{i}"): b.healthy() for i in range(4)}
    table[_key("chip-3")] = b.record(H.UNHEALTHY, "link down")
    entries = podstatus.container_entries(_update(pod, index, table), claims.CONTAINERS, "main")
    assert [(r["resourceID"], r["health"]) for r in entries[0]["resources"]] == [
        ("google.com/tpu=0", "Healthy"),
        ("google.com/tpu=1", "Healthy"),
        ("google.com/tpu=2", "Healthy"),
        ("google.com/tpu=3", "Unhealthy"),
    ]


def test_one_device_listed_twice_is_reported_once() -> None:
    # The kubelet's dedup still applies where the IDs are the same device's:
    # a shared device in one claim twice (two share IDs, the same CDI ID).
    shared = [
        claims.PreparedDevice(DRV, "pool", "gpu-0", cdi_ids=("gpu=0",), share_id=s)
        for s in ("a", "b")
    ]
    pod, index = _setup(*shared)
    entries = podstatus.container_entries(_update(pod, index), claims.CONTAINERS, "main")
    assert [r["resourceID"] for r in entries[0]["resources"]] == [f"{DRV}/pool/gpu-0"]


def test_containers_without_claims_and_device_plugin_entries_are_untouched() -> None:
    statuses = [
        {"name": "main", "allocatedResourcesStatus": [DEVICE_PLUGIN_ENTRY]},
        {"name": "plain", "allocatedResourcesStatus": [DEVICE_PLUGIN_ENTRY], "ready": False},
    ]
    pod, index = _setup(
        _dev("gpu-0"),
        containers=[b.container("main", ("gpu", "")), {"name": "plain"}],
        container_statuses=statuses,
    )
    new = _update(pod, index)
    assert new["containerStatuses"][1] == statuses[1]
    names = [e["name"] for e in new["containerStatuses"][0]["allocatedResourcesStatus"]]
    assert names == ["claim:gpu", "example.com/gpu"]  # kept, and sorted by name (v1.38)


def test_entry_of_a_claim_with_no_visible_devices_is_removed() -> None:
    stale = {"name": "claim:gpu/other", "resources": [{"resourceID": "x", "health": "Healthy"}]}
    pod, index = _setup(
        _dev("gpu-0", requests=("train",)),
        containers=[b.container("main", ("gpu", "other"))],
        container_statuses=[{"name": "main", "allocatedResourcesStatus": [stale]}],
    )
    assert "allocatedResourcesStatus" not in _update(pod, index)["containerStatuses"][0]


def test_unknown_claim_leaves_existing_entry_alone() -> None:
    kept = {"name": "claim:gpu", "resources": [{"resourceID": "x", "health": "Unhealthy"}]}
    pod = b.pod(
        claims=[{"name": "gpu", "resourceClaimName": "gpu-claim"}],
        containers=[b.container("main", ("gpu", ""))],
        container_statuses=[{"name": "main", "allocatedResourcesStatus": [kept]}],
    )
    index = claims.ClaimIndex()
    index.set_pod(pod)  # claim not known yet: the kubelet skips it
    assert _update(pod, index)["containerStatuses"][0]["allocatedResourcesStatus"] == [kept]


def test_expired_lease_reads_unknown_without_message() -> None:
    pod, index = _setup(_dev("gpu-0"))
    table = {_key("gpu-0"): b.record(H.UNHEALTHY, "ECC")}
    fresh = _update(pod, index, table, now=b.NOW + 30)
    late = _update(pod, index, table, now=b.NOW + 30.001)
    assert fresh["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"] == [
        {"resourceID": f"{DRV}/pool/gpu-0", "health": "Unhealthy", "message": "ECC"}
    ]
    assert late["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"] == [
        {"resourceID": f"{DRV}/pool/gpu-0", "health": "Unknown"}
    ]


@pytest.mark.parametrize(
    ("sidecars", "expected"), [(True, ["claim:gpu"]), (False, [])], ids=["on", "off"]
)
def test_restartable_init_containers_get_status_entries(
    sidecars: bool, expected: list[str]
) -> None:
    pod, index = _setup(
        _dev("gpu-0"),
        containers=[{"name": "main"}],
        init_containers=[
            b.container("sidecar", ("gpu", ""), restart="Always"),
            b.container("setup", ("gpu", "")),
        ],
        container_statuses=[{"name": "main"}],
        init_container_statuses=[{"name": "sidecar"}, {"name": "setup"}],
    )
    new = _update(pod, index, sidecars=sidecars)
    sidecar, setup = new["initContainerStatuses"]
    assert [e["name"] for e in sidecar.get("allocatedResourcesStatus", [])] == expected
    assert "allocatedResourcesStatus" not in setup  # the kubelet skips plain init containers too


def test_merge_reports_no_change_when_only_order_differs() -> None:
    pod, index = _setup(_dev("gpu-0"), _dev("gpu-1"))
    desired = podstatus.desired_status(
        pod, index=index, health_of=lambda _k: b.healthy(), now=b.NOW
    )
    first, changed = podstatus.merge(pod["status"], desired, now=b.NOW)
    assert changed
    entry = first["containerStatuses"][0]["allocatedResourcesStatus"][0]
    entry["resources"].reverse()
    again, changed_again = podstatus.merge(first, desired, now=b.NOW)
    assert not changed_again
    assert again == first


def test_merge_preserves_other_container_fields_and_does_not_touch_input() -> None:
    pod, index = _setup(
        _dev("gpu-0"),
        container_statuses=[{"name": "main", "ready": True, "restartCount": 3, "image": "i"}],
    )
    before = repr(pod["status"])
    desired = podstatus.desired_status(
        pod, index=index, health_of=lambda _k: b.healthy(), now=b.NOW
    )
    new, _ = podstatus.merge(pod["status"], desired, now=b.NOW)
    assert repr(pod["status"]) == before
    cs = new["containerStatuses"][0]
    assert (cs["ready"], cs["restartCount"], cs["image"]) == (True, 3, "i")


def test_missing_container_status_is_not_created() -> None:
    pod, index = _setup(_dev("gpu-0"), container_statuses=[])
    desired = podstatus.desired_status(
        pod, index=index, health_of=lambda _k: b.healthy(), now=b.NOW
    )
    new, changed = podstatus.merge(pod["status"], desired, now=b.NOW)
    assert not changed
    assert new["containerStatuses"] == []


def test_merge_never_modifies_the_status_it_is_given() -> None:
    import copy as copy_mod

    pod, index = _setup(_dev("gpu-0"), container_statuses=[
        {"name": "main", "ready": True, "allocatedResourcesStatus": [DEVICE_PLUGIN_ENTRY]},
        {"name": "other", "ready": False},
    ])  # fmt: skip
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    before = copy_mod.deepcopy(pod["status"])
    health = {_key("gpu-0"): models.DeviceHealth(H.UNHEALTHY, "ECC", 30.0, 0.0)}
    desired = podstatus.desired_status(
        pod, index=index, health_of=health.__getitem__, now=1.0, condition_type="DeviceHealthy"
    )
    new, changed = podstatus.merge(pod["status"], desired, now=1.0)
    assert changed
    assert pod["status"] == before
    names = [e["name"] for e in new["containerStatuses"][0]["allocatedResourcesStatus"]]
    assert names == ["claim:gpu", "example.com/gpu"]  # kept, and sorted by name (v1.38)
    assert new["containerStatuses"][1] is pod["status"]["containerStatuses"][1]  # shared, unchanged

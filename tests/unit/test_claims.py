"""The claim index: resolution, request filtering, shared devices, incremental updates.

Notification cases mirror the kubelet's ``TestHandleWatchResourcesStream``
(reference section 6.2): a changed device reaches exactly the pods whose
claims hold it, share IDs ignored.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubelet_dra import models
from kubelet_dra.status import claims
from tests.unit import _podstatus_builders as b

DRV = "test-driver"


def _key(device: str, pool: str = "pool") -> models.DeviceKey:
    return models.DeviceKey(DRV, pool, device)


def _gpu_pod(uid: str, claim_name: str, *, request: str = "") -> dict[str, Any]:
    return b.pod(
        uid=uid, name=uid,
        claims=[{"name": "gpu", "resourceClaimName": claim_name}],
        containers=[b.container("main", ("gpu", request))],
    )  # fmt: skip


def test_allocated_device_change_names_its_pod() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1"))
    index.set_claim(b.claim("c1", ("gpu", DRV, "pool", "dev")))
    assert index.pods_for_devices([_key("dev")]) == {"p1"}


def test_non_allocated_device_change_names_no_pod() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1"))
    index.set_claim(b.claim("c1", ("gpu", DRV, "pool", "dev")))
    assert index.pods_for_devices([_key("other-device")]) == frozenset()


@pytest.mark.parametrize("share_ids", [("s1", "s2"), (None, None)], ids=["share-ids", "plain"])
def test_shared_device_names_every_pod(share_ids: tuple[str | None, str | None]) -> None:
    index = claims.ClaimIndex()
    for n, share in enumerate(share_ids):
        index.set_pod(_gpu_pod(f"p{n}", f"c{n}"))
        index.add_prepared_claim(
            namespace="default", name=f"c{n}", pod_uids=[f"p{n}"],
            devices=[claims.PreparedDevice(DRV, "pool", "dev", share_id=share)],
        )  # fmt: skip
    assert index.pods_for_devices([_key("dev")]) == {"p0", "p1"}
    claim = index.claim(claims.ClaimKey("default", "c0"))
    assert claim is not None
    assert claim.devices[0].share_id == share_ids[0]


def test_uses_name_container_reference_and_request() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1", request="train"))
    index.set_claim(
        b.claim("c1", ("train/fast", DRV, "pool", "dev"), ("infer", DRV, "pool", "dev2"))
    )
    assert index.uses(_key("dev")) == [claims.DeviceUse("p1", "main", "gpu", "train")]
    assert index.uses(_key("dev2")) == []  # filtered out by request, but still the pod's device
    assert index.pods_for_devices([_key("dev2")]) == {"p1"}
    assert [d.device for _, d in index.devices_of_pod("p1")] == ["dev"]


def test_template_claim_resolves_through_status_and_needs_pod_ownership() -> None:
    pod = b.pod(
        uid="p1",
        claims=[{"name": "gpu", "resourceClaimTemplateName": "tmpl"}],
        statuses=[{"name": "gpu", "resourceClaimName": "p1-gpu-abc"}],
        containers=[b.container("main", ("gpu", ""))],
    )
    index = claims.ClaimIndex()
    delta = index.set_pod(pod)
    assert delta.claims_added == {claims.ClaimKey("default", "p1-gpu-abc")}
    index.set_claim(b.claim("p1-gpu-abc", ("gpu", DRV, "pool", "dev"), owner="someone-else"))
    assert index.devices_of_pod("p1") == []
    index.set_claim(b.claim("p1-gpu-abc", ("gpu", DRV, "pool", "dev"), owner="p1"))
    assert [d.device for _, d in index.devices_of_pod("p1")] == ["dev"]


def test_template_claim_not_created_yet_is_not_referenced() -> None:
    pod = b.pod(
        uid="p1",
        claims=[{"name": "gpu", "resourceClaimTemplateName": "tmpl"}],
        containers=[b.container("main", ("gpu", ""))],
    )
    index = claims.ClaimIndex()
    assert index.set_pod(pod).claims_added == frozenset()
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "gen"}]
    assert index.set_pod(pod).claims_added == {claims.ClaimKey("default", "gen")}


def test_status_entry_without_claim_name_means_no_claim() -> None:
    pod = b.pod(
        claims=[{"name": "gpu", "resourceClaimTemplateName": "tmpl"}],
        statuses=[{"name": "gpu"}],
    )
    assert claims.resolve_claim_name(pod, "gpu") == (None, True)


def test_referenced_claims_follow_the_pods() -> None:
    index = claims.ClaimIndex()
    d1 = index.set_pod(_gpu_pod("p1", "shared"))
    d2 = index.set_pod(_gpu_pod("p2", "shared"))
    index.set_claim(b.claim("shared", ("gpu", DRV, "pool", "dev")))
    shared = frozenset({claims.ClaimKey("default", "shared")})
    assert (d1.claims_added, d2.claims_added) == (shared, frozenset())
    assert index.remove_pod("p1").claims_removed == frozenset()
    assert index.remove_pod("p2").claims_removed == {claims.ClaimKey("default", "shared")}
    assert index.referenced_claims() == frozenset()
    assert index.pods_for_devices([_key("dev")]) == frozenset()
    assert index.stats()["claims_api"] == 0  # memory follows the node's pods


def test_pod_switching_claims_reports_both_sides() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "old"))
    delta = index.set_pod(_gpu_pod("p1", "new"))
    assert delta.claims_added == {claims.ClaimKey("default", "new")}
    assert delta.claims_removed == {claims.ClaimKey("default", "old")}


def test_prepared_claim_wins_over_api_view_and_falls_back_on_removal() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1"))
    index.set_claim(b.claim("c1", ("gpu", DRV, "pool", "dev")))
    prepared = claims.PreparedDevice(DRV, "pool", "dev", cdi_ids=("test-driver/gpu=dev",))
    delta = index.add_prepared_claim(namespace="default", name="c1", devices=[prepared])
    assert delta.pods == {"p1"}
    assert index.devices_of_pod("p1")[0][1].resource_id == "test-driver/gpu=dev"
    index.remove_prepared_claim(namespace="default", name="c1")
    assert index.devices_of_pod("p1")[0][1].resource_id == "test-driver/pool/dev"


def test_claim_update_reports_pods_only_on_real_change() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1"))
    assert index.set_claim(b.claim("c1")).pods == {"p1"}  # known now, even if unallocated
    assert index.set_claim(b.claim("c1", ("gpu", DRV, "pool", "dev"))).pods == {"p1"}
    assert index.set_claim(b.claim("c1", ("gpu", DRV, "pool", "dev"))).pods == frozenset()
    assert index.remove_claim("default", "c1").pods == {"p1"}
    assert index.pods_for_devices([_key("dev")]) == frozenset()


def test_prepared_claim_pod_uids_are_notified_without_a_pod_object() -> None:
    index = claims.ClaimIndex()
    index.add_prepared_claim(
        namespace="ns", name="c", pod_uids=["agent-pod"],
        devices=[claims.PreparedDevice(DRV, "pool", "dev")],
    )  # fmt: skip
    assert index.pods_for_devices([_key("dev")]) == {"agent-pod"}
    assert index.remove_prepared_claim(namespace="ns", name="c").pods == {"agent-pod"}


def test_sidecar_claims_can_be_switched_off() -> None:
    pod = b.pod(
        uid="p1",
        claims=[{"name": "gpu", "resourceClaimName": "c1"}],
        init_containers=[b.container("side", ("gpu", ""), restart="Always")],
    )
    for sidecars, expected in ((True, ["side"]), (False, [])):
        index = claims.ClaimIndex(sidecars=sidecars)
        index.set_pod(pod)
        index.set_claim(b.claim("c1", ("gpu", DRV, "pool", "dev")))
        assert [u.container for u in index.uses(_key("dev"))] == expected


def test_snapshot_keeps_devices_after_the_claim_is_gone() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1"))
    index.add_prepared_claim(
        namespace="default", name="c1", devices=[claims.PreparedDevice(DRV, "pool", "dev")]
    )
    frozen = index.snapshot("p1")
    index.remove_prepared_claim(namespace="default", name="c1")
    assert index.devices_for("p1", claims.ClaimKey("default", "c1")) is None
    assert frozen.device_keys() == {_key("dev")}


@pytest.mark.parametrize(
    ("request_names", "wanted", "serves"),
    [((), "any", True), (("a",), "", True), (("a",), "a/x", True), (("a/x",), "a", False),
     (("a/x",), "a/x", False), (("b",), "a", False)],
    ids=["no-names", "no-request", "subrequest", "names-as-returned", "names-as-returned-sub",
         "other"],
)  # fmt: skip
def test_request_filter(request_names: tuple[str, ...], wanted: str, serves: bool) -> None:
    device = claims.PreparedDevice(DRV, "pool", "dev", request_names=request_names)
    assert device.serves(wanted) is serves


# -- naming (issue 19) ---------------------------------------------------------------


def _cdi(device: str, *cdi: str) -> claims.PreparedDevice:
    return claims.PreparedDevice("tpu.google.com", "pool", device, cdi_ids=cdi)


def test_own_resource_ids_leave_distinct_first_ids_as_the_kubelet_has_them() -> None:
    devices = claims.own_resource_ids([_cdi("a", "x=a", "x=common"), _cdi("b", "x=b", "x=common")])
    assert [(d.kubelet_id, d.resource_id) for d in devices] == [("x=a", "x=a"), ("x=b", "x=b")]


def test_own_resource_ids_give_each_sharing_device_its_first_unshared_id() -> None:
    devices = claims.own_resource_ids(
        [
            _cdi("c0", "x=common", "x=0"),  # x=0 is c1's too: driver/pool/device
            _cdi("c1", "x=common", "x=0", "x=1"),  # x=0 is c0's too: the next one
            _cdi("c2", "x=common"),  # nothing of its own: driver/pool/device
            _cdi("d", "x=d"),
            claims.PreparedDevice("tpu.google.com", "pool", "e"),
        ]
    )
    assert [d.resource_id for d in devices] == [
        "tpu.google.com/pool/c0",
        "x=1",
        "tpu.google.com/pool/c2",
        "x=d",
        "tpu.google.com/pool/e",
    ]
    assert [d.kubelet_id for d in devices][:3] == ["x=common"] * 3


def test_the_index_names_devices_of_api_and_prepared_claims() -> None:
    index = claims.ClaimIndex()
    index.add_prepared_claim(
        namespace="ns", name="c", devices=[_cdi("c0", "x=common", "x=0"), _cdi("c1", "x=common")]
    )
    key = models.DeviceKey("tpu.google.com", "pool", "c0")
    assert index.resource_ids(key) == ("x=common", "x=0")
    assert index.device_name(key) == "tpu.google.com/pool/c0 (as x=common, ours x=0)"
    other = models.DeviceKey("tpu.google.com", "pool", "c1")
    assert index.device_name(other) == (
        "tpu.google.com/pool/c1 (as x=common, ours tpu.google.com/pool/c1)"
    )
    unknown = models.DeviceKey("d", "p", "x")
    assert index.device_name(unknown) == "d/p/x"


@pytest.mark.parametrize(
    ("kubelet_id", "resource_id", "name"),
    [
        ("d/p/x", "", "d/p/x"),
        ("d/p/x", "d/p/x", "d/p/x"),
        ("vendor.com/gpu=gpu0", "", "d/p/x (as vendor.com/gpu=gpu0)"),
        ("vendor.com/gpu=all", "d/p/x", "d/p/x (as vendor.com/gpu=all, ours d/p/x)"),
        ("v.com/tpu=common", "v.com/tpu=1", "d/p/x (as v.com/tpu=common, ours v.com/tpu=1)"),
    ],
)
def test_device_name_shows_the_kubelets_id_where_it_differs(
    kubelet_id: str, resource_id: str, name: str
) -> None:
    assert claims.device_name(models.DeviceKey("d", "p", "x"), kubelet_id, resource_id) == name

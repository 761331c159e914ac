"""Edges of the claim index that mutation testing found unchecked.

Each test pins one behaviour of ``claims`` that a surviving mutant broke
without any other test noticing: defaults of the public functions, what the
index keeps of a pod, references by name against template claims, which
devices keep the kubelet's ``resourceID`` and the deltas of a replaced
prepared claim.
"""

from __future__ import annotations

from typing import Any

from kubelet_dra import models
from kubelet_dra.status import claims
from tests.unit import _podstatus_builders as b

DRV = "test-driver"
TPU = "tpu.google.com"
K = claims.ClaimKey


def _key(device: str) -> models.DeviceKey:
    return models.DeviceKey(DRV, "pool", device)


def _gpu_pod(uid: str, claim_name: str) -> dict[str, Any]:
    return b.pod(
        uid=uid, name=uid,
        claims=[{"name": "gpu", "resourceClaimName": claim_name}],
        containers=[b.container("main", ("gpu", ""))],
    )  # fmt: skip


def _cdi(device: str, *cdi: str) -> claims.PreparedDevice:
    return claims.PreparedDevice(TPU, "pool", device, cdi_ids=cdi)


# -- naming ------------------------------------------------------------------------


def test_device_name_without_our_id_uses_the_kubelets() -> None:
    key = models.DeviceKey("d", "p", "x")
    assert claims.device_name(key, "d/p/x") == "d/p/x"
    assert claims.device_name(key, "vendor.com/gpu=gpu0") == "d/p/x (as vendor.com/gpu=gpu0)"


def test_distinct_first_ids_stay_even_where_another_device_lists_them_later() -> None:
    devices = claims.own_resource_ids([_cdi("a", "x=a"), _cdi("b", "x=b", "x=a")])
    assert [d.resource_id for d in devices] == ["x=a", "x=b"]


def test_only_devices_sharing_a_first_id_take_another() -> None:
    devices = claims.own_resource_ids(
        [
            _cdi("c0", "x=common", "x=d"),  # x=d is d's too: driver/pool/device
            _cdi("c1", "x=common", "x=1"),
            _cdi("d", "x=d"),  # its first ID is its own: the kubelet's, though c0 lists it
        ]
    )
    assert [d.resource_id for d in devices] == [f"{TPU}/pool/c0", "x=1", "x=d"]
    assert [d.kubelet_id for d in devices] == ["x=common", "x=common", "x=d"]


# -- pods --------------------------------------------------------------------------


def test_the_index_keeps_a_pods_identity_and_names_it_in_the_delta() -> None:
    index = claims.ClaimIndex()
    pod = b.pod(
        uid="p1", name="trainer", namespace="ml", node="node-b",
        claims=[{"name": "gpu", "resourceClaimName": "c1"}],
        containers=[b.container("main", ("gpu", ""))],
    )  # fmt: skip
    assert index.set_pod(pod).pods == {"p1"}
    kept = index.pod("p1")
    assert kept is not None
    assert (kept.uid, kept.namespace, kept.name, kept.node) == ("p1", "ml", "trainer", "node-b")
    assert kept.refs == {"gpu": K("ml", "c1")}


def test_a_reference_the_pod_does_not_have_resolves_to_nothing() -> None:
    pod = _gpu_pod("p1", "c1")
    assert claims.resolve_claim_name(pod, "ghost") == (None, False)
    assert claims.resolve_claim_name(pod, "gpu") == ("c1", False)


def test_a_claim_referenced_by_name_is_the_pods_whoever_owns_it() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1"))
    index.set_claim(b.claim("c1", ("gpu", DRV, "pool", "dev"), owner="someone-else"))
    pod = index.pod("p1")
    assert pod is not None and pod.templated == frozenset()
    [device] = index.devices_for("p1", K("default", "c1")) or ()
    assert device.key == _key("dev")
    assert index.uses(_key("dev")) == [claims.DeviceUse("p1", "main", "gpu", "")]


def test_sidecar_claims_are_indexed_by_default() -> None:
    pod = b.pod(
        uid="p1",
        claims=[{"name": "gpu", "resourceClaimName": "c1"}],
        init_containers=[b.container("side", ("gpu", ""), restart="Always")],
    )
    index = claims.ClaimIndex()
    index.set_pod(pod)
    index.set_claim(b.claim("c1", ("gpu", DRV, "pool", "dev")))
    assert [u.container for u in index.uses(_key("dev"))] == ["side"]


# -- prepared claims ---------------------------------------------------------------


def test_a_prepared_claim_keeps_its_key_and_uid() -> None:
    index = claims.ClaimIndex()
    device = claims.PreparedDevice(DRV, "pool", "dev")
    index.add_prepared_claim(namespace="ns", name="with", devices=[device], uid="u-1")
    index.add_prepared_claim(namespace="ns", name="without", devices=[device])
    with_uid, without_uid = index.claim(K("ns", "with")), index.claim(K("ns", "without"))
    assert with_uid is not None and without_uid is not None
    assert (with_uid.key, with_uid.uid) == (K("ns", "with"), "u-1")
    assert (without_uid.key, without_uid.uid) == (K("ns", "without"), "")


def test_replacing_a_prepared_claim_moves_its_pods_off_the_old_devices() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1"))
    old = [claims.PreparedDevice(DRV, "pool", "old")]
    new = [claims.PreparedDevice(DRV, "pool", "new")]
    index.add_prepared_claim(namespace="default", name="c1", devices=old, pod_uids=["agent"])
    delta = index.add_prepared_claim(namespace="default", name="c1", devices=new)
    assert delta.pods == {"p1", "agent"}  # the pod it no longer names hears of it too
    assert index.pods_for_devices([_key("old")]) == frozenset()
    assert index.pods_for_devices([_key("new")]) == {"p1"}
    assert index.stats()["devices"] == 1


def test_preparing_the_same_claim_again_notifies_nobody() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1"))
    devices = [claims.PreparedDevice(DRV, "pool", "dev")]
    assert index.add_prepared_claim(namespace="default", name="c1", devices=devices).pods == {"p1"}
    again = index.add_prepared_claim(namespace="default", name="c1", devices=devices)
    assert again == claims.Delta()

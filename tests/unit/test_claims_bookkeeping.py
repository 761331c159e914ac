"""The claim index's bookkeeping: what a claim dict yields, deltas, removals, lookups.

Written against the mutants that ``tox -e mutation`` found alive in ``claims``
(docs/testing.md): each test pins one behaviour that a plausible slip in the
index would break without any other test noticing.
"""

from __future__ import annotations

from typing import Any

from kubelet_dra import models
from kubelet_dra.status import claims
from tests.unit import _podstatus_builders as b

DRV = "test-driver"
K = claims.ClaimKey


def _key(device: str) -> models.DeviceKey:
    return models.DeviceKey(DRV, "pool", device)


def _gpu_pod(uid: str, claim_name: str, *, request: str = "") -> dict[str, Any]:
    return b.pod(
        uid=uid, name=uid,
        claims=[{"name": "gpu", "resourceClaimName": claim_name}],
        containers=[b.container("main", ("gpu", request))],
    )  # fmt: skip


def _template_pod(uid: str, generated: str) -> dict[str, Any]:
    return b.pod(
        uid=uid, name=uid,
        claims=[{"name": "gpu", "resourceClaimTemplateName": "tmpl"}],
        statuses=[{"name": "gpu", "resourceClaimName": generated}],
        containers=[b.container("main", ("gpu", ""))],
    )  # fmt: skip


def _result_claim(name: str, result: dict[str, Any]) -> dict[str, Any]:
    claim = b.claim(name, ("gpu", DRV, "pool", "dev"))
    claim["status"]["allocation"]["devices"]["results"] = [result]
    return claim


# -- a claim dict as the index holds it --------------------------------------------


def test_a_claim_keeps_its_uid_and_each_result_its_share_id() -> None:
    claim = claims.claim_from_api(
        _result_claim("c1", {"driver": DRV, "pool": "pool", "device": "dev", "shareID": "s-1"})
    )
    assert claim.uid == "claim-uid"
    assert [(d.key, d.share_id) for d in claim.devices] == [(_key("dev"), "s-1")]


def test_a_new_share_id_of_the_same_device_notifies_the_pod() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1"))
    index.set_claim(_result_claim("c1", {"driver": DRV, "pool": "pool", "device": "dev"}))
    shared = {"driver": DRV, "pool": "pool", "device": "dev", "shareID": "s-1"}
    assert index.set_claim(_result_claim("c1", shared)).pods == {"p1"}


def test_a_result_without_a_request_is_seen_by_every_request() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1", request="train"))
    index.set_claim(_result_claim("c1", {"driver": DRV, "pool": "pool", "device": "dev"}))
    assert index.uses(_key("dev")) == [claims.DeviceUse("p1", "main", "gpu", "train")]


def test_only_a_controlling_pod_owns_a_claim() -> None:
    claim = b.claim("c1", ("gpu", DRV, "pool", "dev"))
    claim["metadata"]["ownerReferences"] = [
        {"kind": "Pod", "uid": "controller", "controller": True},
        {"kind": "Pod", "uid": "not-controller", "controller": False},
        {"kind": "Pod", "uid": "no-controller-field"},
        {"kind": "ReplicaSet", "uid": "rs", "controller": True},
        {"kind": "Pod", "controller": True},  # no uid: nobody
    ]
    assert claims.claim_from_api(claim).owners == {"controller"}


def test_a_claim_is_allocated_only_with_devices() -> None:
    assert claims.is_allocated(b.claim("c1", ("gpu", DRV, "pool", "dev")))
    assert not claims.is_allocated(b.claim("c1"))


# -- deltas ------------------------------------------------------------------------


def test_deltas_combine_pods_and_let_the_later_claim_change_win() -> None:
    a, c = K("ns", "a"), K("ns", "c")
    first = claims.Delta(frozenset({"p1"}), frozenset({a}), frozenset({c}))
    later = claims.Delta(frozenset({"p2"}), frozenset({c}), frozenset({a}))
    assert first | later == claims.Delta(frozenset({"p1", "p2"}), frozenset({c}), frozenset({a}))
    both = claims.Delta(claims_added=frozenset({a}), claims_removed=frozenset({c}))
    assert both | claims.Delta() == both
    assert claims.Delta() | both == both


# -- removals ----------------------------------------------------------------------


def test_removing_what_the_index_does_not_hold_changes_nothing() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1"))
    assert index.remove_pod("ghost") == claims.Delta()
    assert index.remove_claim("default", "ghost") == claims.Delta()
    assert index.remove_prepared_claim(namespace="default", name="ghost") == claims.Delta()
    assert index.pod_uids() == {"p1"}


def test_removing_a_pod_names_it() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1"))
    assert index.remove_pod("p1").pods == {"p1"}
    assert index.pod("p1") is None and index.pod_uids() == frozenset()


def test_removing_a_prepared_claim_notifies_its_pods_and_forgets_its_devices() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1"))
    index.add_prepared_claim(
        namespace="default", name="c1", devices=[claims.PreparedDevice(DRV, "pool", "dev")]
    )
    assert index.remove_prepared_claim(namespace="default", name="c1").pods == {"p1"}
    assert index.pods_for_devices([_key("dev")]) == frozenset()
    assert index.stats()["devices"] == 0


def test_a_device_of_two_claims_stays_indexed_while_one_holds_it() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1"))
    index.set_pod(_gpu_pod("p2", "c2"))
    index.set_claim(b.claim("c1", ("gpu", DRV, "pool", "dev")))
    index.set_claim(b.claim("c2", ("gpu", DRV, "pool", "dev")))
    index.remove_claim("default", "c1")
    assert index.pods_for_devices([_key("dev")]) == {"p2"}


def test_the_last_pod_of_an_api_claim_takes_its_devices_out_of_the_index() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1"))
    index.set_claim(b.claim("c1", ("gpu", DRV, "pool", "dev")))
    index.remove_pod("p1")
    assert index.stats() == {
        "pods": 0, "claims_referenced": 0, "claims_api": 0, "claims_prepared": 0,
        "claims_named": 0, "devices": 0,
    }  # fmt: skip


# -- lookups -----------------------------------------------------------------------


def test_the_index_says_what_it_holds() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1"))
    index.set_pod(_gpu_pod("p2", "c2"))
    index.set_claim(b.claim("c1", ("gpu", DRV, "pool", "dev")))
    index.add_prepared_claim(namespace="default", name="c2", devices=[])
    pod = index.pod("p1")
    assert pod is not None and pod.refs == {"gpu": K("default", "c1")}
    assert index.pod_uids() == {"p1", "p2"}
    assert index.stats() == {
        "pods": 2, "claims_referenced": 2, "claims_api": 1, "claims_prepared": 1,
        "claims_named": 0, "devices": 1,
    }  # fmt: skip


def test_devices_of_a_pod_name_the_use_that_sees_each() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1", request="train"))
    index.set_claim(b.claim("c1", ("train", DRV, "pool", "dev")))
    [(use, device)] = index.devices_of_pod("p1")
    assert use == claims.DeviceUse("p1", "main", "gpu", "train")
    assert device.key == _key("dev")
    assert index.devices_of_pod("ghost") == []


def test_a_device_nobody_uses_has_no_uses() -> None:
    index = claims.ClaimIndex()
    assert index.uses(_key("unknown")) == []
    index.add_prepared_claim(  # a claim no indexed pod references
        namespace="default", name="c1", devices=[claims.PreparedDevice(DRV, "pool", "dev")]
    )
    assert index.uses(_key("dev")) == []


def test_a_template_claim_owned_by_another_pod_is_no_use_and_no_snapshot_of_this_pod() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_template_pod("p1", "gen"))
    index.set_claim(b.claim("gen", ("gpu", DRV, "pool", "dev"), owner="someone-else"))
    assert index.uses(_key("dev")) == []
    assert index.snapshot("p1").claims == {}
    assert index.snapshot("ghost").claims == {}


def test_a_snapshot_answers_for_its_own_claims_only() -> None:
    index = claims.ClaimIndex()
    index.set_pod(_gpu_pod("p1", "c1"))
    index.set_claim(b.claim("c1", ("gpu", DRV, "pool", "dev")))
    frozen = index.snapshot("p1")
    [device] = frozen.devices_for("any-pod", K("default", "c1")) or ()
    assert device.key == _key("dev")
    assert frozen.devices_for("p1", K("default", "other")) is None

"""Kubelet v1.38 order of ``allocatedResourcesStatus``: entries by name, resources by ID.

Go's ``cmp.Compare`` on strings is byte order of the UTF-8 text: upper case
before lower case, ASCII before any multi-byte character, and a 3-byte
character (U+FF5E) before a 4-byte one (U+1F600) (UTF-16 order would put the
surrogate pair first).
"""

from __future__ import annotations

from typing import Any

import pytest

from kubelet_dra import models
from kubelet_dra.kube import patchplan
from kubelet_dra.status import claims, podstatus
from tests.unit import _podstatus_builders as b

DRV = "gpu.example.com"
ARS = "allocatedResourcesStatus"
# Each list is in the byte order Go sorts it.
BYTE_ORDER = ["A", "Z", "a", "z", "~", "é", "\uff5e", "\U0001f600"]


def _go_order(texts: list[str]) -> list[str]:
    # The definition, independent of the code under test.
    return sorted(texts, key=lambda t: t.encode("utf-8"))


def test_the_reference_order_is_byte_order() -> None:
    assert _go_order(list(reversed(BYTE_ORDER))) == BYTE_ORDER
    # UTF-16 code unit order differs for the last two: proof the case tests something.
    assert sorted(BYTE_ORDER[-2:], key=lambda t: t.encode("utf-16-be")) != BYTE_ORDER[-2:]


@pytest.mark.parametrize(
    ("names", "ids"),
    [
        (["claim:b", "claim:a"], ["d/p/2", "d/p/10", "d/p/1"]),
        ([f"claim:{c}" for c in reversed(BYTE_ORDER)], [f"x/{c}" for c in reversed(BYTE_ORDER)]),
        (["claim:gpu/req-1", "claim:gpu", "claim:gpu/req-0"], ["B", "a", "_"]),
    ],
    ids=["ascii", "non-ascii-byte-order", "requests"],
)
def test_sort_entries_is_go_byte_order(names: list[str], ids: list[str]) -> None:
    entries = [
        {"name": n, "resources": [{"resourceID": i, "health": "Healthy"} for i in ids]}
        for n in names
    ]
    before = [dict(e) for e in entries]
    out = podstatus.sort_entries(entries)
    assert [e["name"] for e in out] == _go_order(names)
    assert all([r["resourceID"] for r in e["resources"]] == _go_order(ids) for e in out)
    assert entries == before  # the input is not modified


def _pod_with(
    refs: list[str], devices: dict[str, list[claims.PreparedDevice]], statuses: Any = None
) -> tuple[dict[str, Any], claims.ClaimIndex]:
    pod = b.pod(
        claims=[{"name": r, "resourceClaimName": f"obj-{i}"} for i, r in enumerate(refs)],
        containers=[b.container("main", *((r, "") for r in refs))],
        container_statuses=statuses or [{"name": "main"}],
    )
    index = claims.ClaimIndex()
    index.set_pod(pod)
    for i, ref in enumerate(refs):
        index.add_prepared_claim(namespace="default", name=f"obj-{i}", devices=devices[ref])
    return pod, index


def _devices(*names: str) -> list[claims.PreparedDevice]:
    return [claims.PreparedDevice(DRV, "pool", n) for n in names]


def _update(pod: dict[str, Any], index: claims.ClaimIndex, **kw: Any) -> dict[str, Any]:
    return podstatus.update_allocated_resources_status(
        pod, pod["status"], index=index, health_of=lambda _k: b.healthy(), now=b.NOW, **kw
    )


def test_kubelet_function_sorts_entries_and_resources() -> None:
    refs = ["zeta", "Alpha", "émile", "beta"]
    devices = {r: _devices("gpu-9", "gpu-10", "GPU-1", "gpü") for r in refs}
    pod, index = _pod_with(refs, devices)
    entries = podstatus.container_entries(_update(pod, index), claims.CONTAINERS, "main")
    assert [e["name"] for e in entries] == [
        "claim:Alpha",
        "claim:beta",
        "claim:zeta",
        "claim:émile",
    ]
    expected_ids = [f"{DRV}/pool/{d}" for d in ("GPU-1", "gpu-10", "gpu-9", "gpü")]
    assert all([r["resourceID"] for r in e["resources"]] == expected_ids for e in entries)


def test_foreign_entries_in_a_managed_container_are_sorted_too() -> None:
    device_plugin = {
        "name": "example.com/gpu",
        "resources": [{"resourceID": "dp-1", "health": "Healthy"}, {"resourceID": "dp-0"}],
    }
    pod, index = _pod_with(
        ["gpu"], {"gpu": _devices("gpu-0")}, [{"name": "main", ARS: [device_plugin]}]
    )
    entries = podstatus.container_entries(_update(pod, index), claims.CONTAINERS, "main")
    assert [e["name"] for e in entries] == ["claim:gpu", "example.com/gpu"]
    assert [r["resourceID"] for r in entries[1]["resources"]] == ["dp-0", "dp-1"]
    assert pod["status"]["containerStatuses"][0][ARS] == [device_plugin]  # input untouched


def test_an_unsorted_but_current_status_is_sorted_by_the_kubelet_function_but_not_written() -> None:
    pod, index = _pod_with(["b", "a"], {"b": _devices("d1", "d0"), "a": _devices("d0")})
    unsorted = [
        {"name": "claim:b", "resources": [
            {"resourceID": f"{DRV}/pool/d1", "health": "Healthy"},
            {"resourceID": f"{DRV}/pool/d0", "health": "Healthy"},
        ]},
        {"name": "claim:a", "resources": [{"resourceID": f"{DRV}/pool/d0", "health": "Healthy"}]},
    ]  # fmt: skip
    pod["status"]["containerStatuses"] = [{"name": "main", ARS: unsorted}]
    # What an older kubelet wrote: same content, insertion order.
    entries = podstatus.container_entries(_update(pod, index), claims.CONTAINERS, "main")
    assert entries == podstatus.sort_entries(unsorted)
    assert entries != unsorted
    # The writer: an order-only difference is no change (listType=map), no request.
    desired = podstatus.desired_status(
        pod, index=index, health_of=lambda _k: b.healthy(), now=b.NOW
    )
    _, changed = podstatus.merge(pod["status"], desired, now=b.NOW, condition=False)
    assert not changed


def test_a_write_sends_the_sorted_list_in_its_json_patch() -> None:
    pod, index = _pod_with(["b", "a"], {"b": _devices("d1", "d0"), "a": _devices("d0")})
    pod["metadata"]["resourceVersion"] = "7"
    old = [
        {"name": "claim:b", "resources": [{"resourceID": f"{DRV}/pool/d1", "health": "Healthy"}]}
    ]
    pod["status"]["containerStatuses"] = [{"name": "main", ARS: old}]
    health = {models.DeviceKey(DRV, "pool", "d0"): b.record(models.HealthStatus.UNHEALTHY, "x")}
    desired = podstatus.desired_status(
        pod, index=index, health_of=lambda k: health.get(k, b.healthy()), now=b.NOW
    )
    planned = patchplan.plan(pod, desired, now=b.NOW, condition=False)
    assert planned is not None
    ops = list(planned.ops)
    sent = ops[-1]
    assert sent["op"] == "add" and sent["path"] == f"/status/containerStatuses/0/{ARS}"
    assert [e["name"] for e in sent["value"]] == ["claim:a", "claim:b"]
    assert [r["resourceID"] for r in sent["value"][1]["resources"]] == [
        f"{DRV}/pool/d0",
        f"{DRV}/pool/d1",
    ]
    # The guard tests the entries it replaces, as they were.
    assert {"op": "test", "path": f"/status/containerStatuses/0/{ARS}", "value": old} in ops
    assert patchplan.assumptions_hold(pod, ops)

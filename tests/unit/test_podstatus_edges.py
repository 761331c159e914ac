"""Edges of the kubelet-exact pod status that mutation testing found unpinned.

Each test names one behaviour of ``podstatus`` that a surviving mutant of the
mutation run changed without any other test noticing: the defaults of
``desired_status`` and ``resource_health``, which container statuses and devices
a claim entry reaches, the condition message at exactly its limit, the sort key
of odd texts, and times in UTC whatever the local time zone.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from kubelet_dra import models
from kubelet_dra.status import claims, podstatus
from tests.unit import _podstatus_builders as b

H = models.HealthStatus
DRV = "gpu.example.com"
TYPE = "DeviceHealthy"
ARS = "allocatedResourcesStatus"


def _key(device: str) -> models.DeviceKey:
    return models.DeviceKey(DRV, "pool", device)


def _pod_and_index(
    *devices: claims.PreparedDevice, **pod_kwargs: Any
) -> tuple[dict[str, Any], claims.ClaimIndex]:
    pod_kwargs.setdefault("claims", [{"name": "gpu", "resourceClaimName": "gpu-claim"}])
    pod_kwargs.setdefault("containers", [b.container("main", ("gpu", ""))])
    pod_kwargs.setdefault("container_statuses", [{"name": "main"}])
    pod = b.pod(**pod_kwargs)
    index = claims.ClaimIndex()
    index.set_pod(pod)
    index.add_prepared_claim(namespace="default", name="gpu-claim", devices=devices)
    return pod, index


def _gpu(device: str, *requests: str) -> claims.PreparedDevice:
    return claims.PreparedDevice(DRV, "pool", device, request_names=requests)


def _unhealthy(_key: models.DeviceKey) -> models.DeviceHealth:
    return b.record(H.UNHEALTHY, "ECC")


def _entry(*devices: str) -> dict[str, Any]:
    return {
        "name": "claim:gpu",
        "resources": [
            {"resourceID": f"{DRV}/pool/{d}", "health": "Unhealthy", "message": "ECC"}
            for d in devices
        ],
    }


# -- desired_status: defaults and what it reaches ------------------------------------


def test_desired_status_keeps_device_messages_and_covers_sidecars_by_default() -> None:
    pod, index = _pod_and_index(
        _gpu("gpu-0"),
        containers=[b.container("main", ("gpu", ""))],
        init_containers=[b.container("sidecar", ("gpu", ""), restart="Always")],
        init_container_statuses=[{"name": "sidecar"}],
    )
    desired = podstatus.desired_status(pod, index=index, health_of=_unhealthy, now=b.NOW)
    assert desired.containers == {
        (claims.CONTAINERS, "main"): {"claim:gpu": _entry("gpu-0")},
        (claims.INIT_CONTAINERS, "sidecar"): {"claim:gpu": _entry("gpu-0")},
    }


def test_desired_status_carries_the_pod_uid_and_its_device_states() -> None:
    pod, index = _pod_and_index(_gpu("gpu-0"), uid="uid-7")
    desired = podstatus.desired_status(pod, index=index, health_of=_unhealthy, now=b.NOW)
    assert desired.pod_uid == "uid-7"
    [state] = desired.devices
    assert (state.key, state.resource_id, state.claim_ref) == (
        _key("gpu-0"),
        f"{DRV}/pool/gpu-0",
        "gpu",
    )
    assert (state.health, state.message) == (H.UNHEALTHY, "ECC")


def test_an_unresolved_claim_does_not_stop_the_container_s_next_claim() -> None:
    pod, index = _pod_and_index(
        _gpu("gpu-0"),
        claims=[
            {"name": "later", "resourceClaimTemplateName": "tmpl"},  # no claim created yet
            {"name": "gpu", "resourceClaimName": "gpu-claim"},
        ],
        containers=[b.container("main", ("later", ""), ("gpu", ""))],
    )
    desired = podstatus.desired_status(pod, index=index, health_of=_unhealthy, now=b.NOW)
    assert desired.containers == {(claims.CONTAINERS, "main"): {"claim:gpu": _entry("gpu-0")}}


def test_a_device_of_another_request_does_not_hide_the_devices_after_it() -> None:
    pod, index = _pod_and_index(
        _gpu("gpu-0", "other"), _gpu("gpu-1", "mine"),
        containers=[b.container("main", ("gpu", "mine"))],
    )  # fmt: skip
    desired = podstatus.desired_status(pod, index=index, health_of=_unhealthy, now=b.NOW)
    assert desired.containers == {
        (claims.CONTAINERS, "main"): {
            "claim:gpu/mine": {**_entry("gpu-1"), "name": "claim:gpu/mine"}
        }
    }


def test_a_generated_claim_owned_by_another_pod_is_not_this_pod_s() -> None:
    pod = b.pod(
        uid="p1",
        claims=[{"name": "gpu", "resourceClaimTemplateName": "tmpl"}],
        statuses=[{"name": "gpu", "resourceClaimName": "p1-gpu-abc"}],
        containers=[b.container("main", ("gpu", ""))],
        container_statuses=[{"name": "main"}],
    )
    index = claims.ClaimIndex()
    index.set_pod(pod)
    index.set_claim(b.claim("p1-gpu-abc", ("", DRV, "pool", "gpu-0"), owner="someone-else"))
    desired = podstatus.desired_status(
        pod, index=index, health_of=_unhealthy, now=b.NOW, condition_type=TYPE
    )
    assert (desired.containers, desired.devices, desired.condition) == ({}, (), None)


def test_the_condition_names_a_device_by_both_ids_where_the_kubelet_s_is_shared() -> None:
    common = "vendor.com/tpu=common"
    pod, index = _pod_and_index(
        claims.PreparedDevice(DRV, "pool", "chip0", cdi_ids=(common, "vendor.com/tpu=chip0")),
        claims.PreparedDevice(DRV, "pool", "chip1", cdi_ids=(common, "vendor.com/tpu=chip1")),
    )
    desired = podstatus.desired_status(
        pod, index=index, health_of=_unhealthy, now=b.NOW, condition_type=TYPE
    )
    assert [(d.resource_id, d.kubelet_id) for d in desired.devices] == [
        ("vendor.com/tpu=chip0", common),
        ("vendor.com/tpu=chip1", common),
    ]
    assert desired.condition is not None
    assert desired.condition["message"] == "Unhealthy devices: " + "; ".join(
        f"{DRV}/pool/{c} (as {common}, ours vendor.com/tpu={c}) (claim gpu): ECC"
        for c in ("chip0", "chip1")
    )


# -- resource_health -------------------------------------------------------------------


def test_resource_health_reads_a_health_given_as_text_and_keeps_the_message_by_default() -> None:
    device = _gpu("gpu-0")
    assert podstatus.resource_health(device, "Unhealthy", "ECC") == {
        "resourceID": f"{DRV}/pool/gpu-0", "health": "Unhealthy", "message": "ECC",
    }  # fmt: skip
    assert podstatus.resource_health(device, "Healthy", "") == {
        "resourceID": f"{DRV}/pool/gpu-0", "health": "Healthy",
    }  # fmt: skip
    assert podstatus.resource_health(device, "Broken", "")["health"] == "Unknown"


# -- merge -------------------------------------------------------------------------------


def test_merge_reaches_a_container_status_listed_after_another_container_s() -> None:
    pod, index = _pod_and_index(
        _gpu("gpu-0"),
        containers=[{"name": "plain"}, b.container("main", ("gpu", ""))],
        container_statuses=[{"name": "plain"}, {"name": "main"}],
    )
    desired = podstatus.desired_status(pod, index=index, health_of=_unhealthy, now=b.NOW)
    new, changed = podstatus.merge(pod["status"], desired, now=b.NOW)
    assert changed
    assert new["containerStatuses"] == [{"name": "plain"}, {"name": "main", ARS: [_entry("gpu-0")]}]


def test_merge_updates_every_status_of_the_container_as_the_kubelet_s_loop_does() -> None:
    pod, index = _pod_and_index(
        _gpu("gpu-0"),
        container_statuses=[{"name": "main", ARS: [_entry("gpu-0")]}, {"name": "main"}],
    )
    desired = podstatus.desired_status(pod, index=index, health_of=_unhealthy, now=b.NOW)
    new, changed = podstatus.merge(pod["status"], desired, now=b.NOW)
    assert changed
    assert new["containerStatuses"] == [
        {"name": "main", ARS: [_entry("gpu-0")]},
        {"name": "main", ARS: [_entry("gpu-0")]},
    ]


def test_a_container_change_is_a_change_when_the_condition_is_already_current() -> None:
    pod, index = _pod_and_index(_gpu("gpu-0"))
    desired = podstatus.desired_status(
        pod, index=index, health_of=_unhealthy, now=b.NOW, condition_type=TYPE
    )
    with_condition, _ = podstatus.merge(pod["status"], desired, now=b.NOW, container_status=False)
    new, changed = podstatus.merge(with_condition, desired, now=b.NOW + 5)
    assert changed
    assert podstatus.container_entries(new, claims.CONTAINERS, "main") == [_entry("gpu-0")]
    assert new["conditions"] == with_condition["conditions"]


# -- the condition message at its limit ----------------------------------------------------


def _states(n: int) -> list[podstatus.DeviceState]:
    return [
        podstatus.DeviceState(_key(f"gpu-{i}"), f"{DRV}/pool/gpu-{i}", "gpu", H.UNHEALTHY, "fault")
        for i in range(n)
    ]


def _listing(n: int, kept: int) -> str:
    # The message written out by hand: the first ``kept`` of ``n`` devices, the rest counted.
    texts = [f"{DRV}/pool/gpu-{i} (claim gpu): fault" for i in range(kept)]
    left = n - kept
    rest = f" (and {left} more device{'s' if left > 1 else ''}: {left} Unhealthy)" if left else ""
    return "Unhealthy devices: " + "; ".join(texts) + rest


@pytest.mark.parametrize("kept", [1, 2, 3, 4, 5])
def test_a_limit_exactly_the_size_of_a_listing_lists_that_many_devices(kept: int) -> None:
    expected = _listing(5, kept)
    limit = len(expected.encode())
    assert len(_listing(5, kept + 1).encode()) > limit  # one more would not fit
    assert podstatus.condition_message(_states(5), limit) == expected


@pytest.mark.parametrize("room", [3, 4, 10])
def test_a_device_cut_to_fit_uses_the_room_left_to_the_last_byte(room: int) -> None:
    # room = the bytes left for the device's text after the title: "..." alone at 3.
    [state] = _states(1)
    text = f"{DRV}/pool/gpu-0 (claim gpu): fault"
    limit = len("Unhealthy devices: ") + room
    message = podstatus.condition_message([state], limit)
    assert message == "Unhealthy devices: " + text[: room - 3] + "..."
    assert len(message.encode()) == limit


def test_a_device_cut_at_the_default_cap_fills_it_exactly() -> None:
    state = podstatus.DeviceState(
        _key("gpu-0"), f"{DRV}/pool/gpu-0", "gpu", H.UNHEALTHY, "x" * 2000
    )
    message = podstatus.condition_message([state])
    assert len(message.encode()) == podstatus.CONDITION_MESSAGE_MAX
    assert message.endswith("x...")


# -- sort keys of odd texts -----------------------------------------------------------------


def test_sorting_copes_with_a_lone_surrogate_in_byte_order() -> None:
    # JSON can carry one ("\ud800"); its UTF-8-style bytes ED A0 80 sort between
    # U+D7FF (ED 9F BF) and U+E000 (EE 80 80).
    names = ["claim:\ue000", "claim:\ud800", "claim:\ud7ff"]
    entries = [{"name": n, "resources": [{"resourceID": i} for i in names]} for n in names]
    out = podstatus.sort_entries(entries)
    in_order = ["claim:\ud7ff", "claim:\ud800", "claim:\ue000"]
    assert [e["name"] for e in out] == in_order
    assert all([r["resourceID"] for r in e["resources"]] == in_order for e in out)


def test_sorting_reads_a_missing_name_or_resource_id_as_empty_text() -> None:
    entries: list[dict[str, Any]] = [
        {"name": "Alpha", "resources": [{"resourceID": "A"}, {"health": "Unknown"}]},
        {"resources": []},
    ]
    out = podstatus.sort_entries(entries)
    assert [e.get("name") for e in out] == [None, "Alpha"]
    assert out[1]["resources"] == [{"health": "Unknown"}, {"resourceID": "A"}]


# -- times --------------------------------------------------------------------------------


@pytest.mark.usefixtures("far_time_zone")
def test_times_are_utc_whatever_the_local_time_zone() -> None:
    assert time.localtime(0).tm_min == 45  # the zone is in effect
    assert podstatus.rfc3339(0) == "1970-01-01T00:00:00Z"
    assert podstatus.rfc3339(b.NOW) == "2023-11-14T22:13:20Z"

"""The device-health pod condition: status, reason, message and lastTransitionTime."""

from __future__ import annotations

from typing import Any

import pytest

from kubelet_dra import models
from kubelet_dra.status import claims, podstatus
from tests.unit import _podstatus_builders as b

H = models.HealthStatus
DRV = "gpu.example.com"
TYPE = "DeviceHealthy"


def _key(device: str) -> models.DeviceKey:
    return models.DeviceKey(DRV, "pool", device)


def _pod_and_index() -> tuple[dict[str, Any], claims.ClaimIndex]:
    pod = b.pod(
        claims=[{"name": "gpu", "resourceClaimName": "gpu-claim"}],
        containers=[b.container("main", ("gpu", ""))],
        container_statuses=[{"name": "main"}],
    )
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    index = claims.ClaimIndex()
    index.set_pod(pod)
    devices = [claims.PreparedDevice(DRV, "pool", d) for d in ("gpu-0", "gpu-1")]
    index.add_prepared_claim(namespace="default", name="gpu-claim", devices=devices)
    return pod, index


def _desired(pod: dict[str, Any], index: claims.ClaimIndex, **health: H) -> podstatus.Desired:
    table = {_key(d): b.record(h, f"{d} says {h}") for d, h in health.items()}
    return podstatus.desired_status(
        pod, index=index, health_of=b.health_map(table), now=b.NOW, condition_type=TYPE
    )


CASES = [
    ("all-healthy", {"gpu_0": H.HEALTHY, "gpu_1": H.HEALTHY}, "True", podstatus.REASON_HEALTHY),
    ("one-unhealthy", {"gpu_0": H.UNHEALTHY, "gpu_1": H.UNKNOWN}, "False",
     podstatus.REASON_UNHEALTHY),
    ("one-unknown", {"gpu_0": H.HEALTHY, "gpu_1": H.UNKNOWN}, "Unknown", podstatus.REASON_UNKNOWN),
    ("never-reported", {}, "Unknown", podstatus.REASON_UNKNOWN),
]  # fmt: skip


@pytest.mark.parametrize(
    ("health", "status", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_condition_summarises_every_device(health: dict[str, H], status: str, reason: str) -> None:
    pod, index = _pod_and_index()
    desired = _desired(pod, index, **{k.replace("_", "-"): v for k, v in health.items()})
    assert desired.condition is not None
    assert (desired.condition["status"], desired.condition["reason"]) == (status, reason)


def test_false_condition_names_only_the_unhealthy_devices() -> None:
    pod, index = _pod_and_index()
    cond = _desired(pod, index, **{"gpu-0": H.HEALTHY, "gpu-1": H.UNHEALTHY}).condition
    assert cond is not None
    assert "gpu.example.com/pool/gpu-1 (claim gpu): gpu-1 says Unhealthy" in cond["message"]
    assert "gpu-0" not in cond["message"]


def test_last_transition_time_moves_only_on_status_change() -> None:
    pod, index = _pod_and_index()
    first, changed = podstatus.merge(
        pod["status"], _desired(pod, index, **{"gpu-0": H.UNHEALTHY}), now=b.NOW
    )
    assert changed
    cond = podstatus.find_condition(first, TYPE)
    assert cond is not None
    assert cond["lastTransitionTime"] == podstatus.rfc3339(b.NOW)
    # Same status, new message (another device also fails): time stays.
    second, changed = podstatus.merge(
        first, _desired(pod, index, **{"gpu-0": H.UNHEALTHY, "gpu-1": H.UNHEALTHY}),
        now=b.NOW + 10,
    )  # fmt: skip
    assert changed
    cond = podstatus.find_condition(second, TYPE)
    assert cond is not None
    assert cond["lastTransitionTime"] == podstatus.rfc3339(b.NOW)
    third, changed = podstatus.merge(
        second, _desired(pod, index, **{"gpu-0": H.HEALTHY, "gpu-1": H.HEALTHY}), now=b.NOW + 20
    )
    assert changed
    cond = podstatus.find_condition(third, TYPE)
    assert cond is not None
    assert (cond["status"], cond["lastTransitionTime"]) == ("True", podstatus.rfc3339(b.NOW + 20))
    assert podstatus.find_condition(third, "Ready") == {"type": "Ready", "status": "True"}


def test_same_condition_is_no_change() -> None:
    pod, index = _pod_and_index()
    desired = _desired(pod, index, **{"gpu-0": H.HEALTHY, "gpu-1": H.HEALTHY})
    first, _ = podstatus.merge(pod["status"], desired, now=b.NOW)
    _, changed = podstatus.merge(first, desired, now=b.NOW + 5, container_status=False)
    assert not changed


def test_empty_condition_type_disables_the_condition() -> None:
    pod, index = _pod_and_index()
    desired = podstatus.desired_status(
        pod, index=index, health_of=lambda _k: b.healthy(), now=b.NOW, condition_type=""
    )
    assert desired.condition is None
    new, _ = podstatus.merge(pod["status"], desired, now=b.NOW)
    assert new["conditions"] == [{"type": "Ready", "status": "True"}]


def test_pod_without_devices_gets_no_condition() -> None:
    pod = b.pod(containers=[{"name": "main"}], container_statuses=[{"name": "main"}])
    desired = podstatus.desired_status(
        pod, index=claims.ClaimIndex(), health_of=lambda _k: b.healthy(), now=b.NOW,
        condition_type=TYPE,
    )  # fmt: skip
    assert desired.condition is None
    assert podstatus.merge(pod["status"], desired, now=b.NOW)[1] is False


def test_long_condition_message_is_capped() -> None:
    pod, index = _pod_and_index()
    table = {_key(d): b.record(H.UNHEALTHY, "x" * 900) for d in ("gpu-0", "gpu-1")}
    desired = podstatus.desired_status(
        pod, index=index, health_of=b.health_map(table), now=b.NOW, condition_type=TYPE
    )
    assert desired.condition is not None
    message = desired.condition["message"]
    assert len(message.encode()) <= podstatus.CONDITION_MESSAGE_MAX
    # The first device whole, the second counted (issue 19), not both cut mid-text.
    assert message.startswith(f"Unhealthy devices: {DRV}/pool/gpu-0 (claim gpu): {'x' * 900}")
    assert message.endswith(" (and 1 more device: 1 Unhealthy)")


def _many(health: dict[str, tuple[H, str]]) -> tuple[dict[str, Any], podstatus.Desired]:
    pod = b.pod(
        claims=[{"name": "gpu", "resourceClaimName": "gpu-claim"}],
        containers=[b.container("main", ("gpu", ""))],
        container_statuses=[{"name": "main"}],
    )
    index = claims.ClaimIndex()
    index.set_pod(pod)
    devices = [claims.PreparedDevice(DRV, "pool", d) for d in health]
    index.add_prepared_claim(namespace="default", name="gpu-claim", devices=devices)
    table = {_key(d): b.record(h, m) for d, (h, m) in health.items()}
    desired = podstatus.desired_status(
        pod, index=index, health_of=b.health_map(table), now=b.NOW, condition_type=TYPE
    )
    return pod, desired


def test_false_condition_carries_every_non_healthy_device_with_health_and_message() -> None:
    # Beside a kubelet that removes allocatedResourcesStatus, the condition is where the
    # health stays: Unknown devices are named too, not only the Unhealthy ones.
    _, desired = _many({
        "gpu-0": (H.HEALTHY, "fine"), "gpu-1": (H.UNKNOWN, ""), "gpu-2": (H.UNHEALTHY, "XID 48"),
        "gpu-3": (H.UNHEALTHY, ""),
    })  # fmt: skip
    assert desired.condition is not None
    assert desired.condition["message"] == (
        f"Unhealthy devices: {DRV}/pool/gpu-2 (claim gpu): XID 48; {DRV}/pool/gpu-3 (claim gpu)."
        f" Health unknown for devices: {DRV}/pool/gpu-1 (claim gpu)"
    )


def test_past_the_cap_devices_are_left_out_last_first_and_counted_deterministically() -> None:
    health = {f"gpu-{n:02}": (H.UNHEALTHY, f"fault {n} " + "y" * 40) for n in range(40)}
    health |= {f"mig-{n:02}": (H.UNKNOWN, "") for n in range(10)}
    _, desired = _many(health)
    assert desired.condition is not None
    message = desired.condition["message"]
    assert len(message.encode()) <= podstatus.CONDITION_MESSAGE_MAX
    listed = [d for d in health if f"/{d} (claim gpu)" in message]
    left = len(health) - len(listed)
    assert listed == list(health)[: len(listed)]  # Unhealthy first, in claim order
    assert message.endswith(f" (and {left} more devices: {left - 10} Unhealthy, 10 Unknown)")
    assert 5 < len(listed) < 40
    # Each listed device whole, and the cap nearly used: no device would still have fitted.
    assert len(message.encode()) > podstatus.CONDITION_MESSAGE_MAX - 60
    assert _many(health)[1].condition == desired.condition  # the same devices, the same text


def test_a_device_too_long_for_the_cap_on_its_own_is_cut() -> None:
    _, desired = _many({"gpu-0": (H.UNHEALTHY, "é" * 512), "gpu-1": (H.UNKNOWN, "")})
    assert desired.condition is not None
    message = desired.condition["message"]
    assert len(message.encode()) <= podstatus.CONDITION_MESSAGE_MAX
    assert message.startswith(f"Unhealthy devices: {DRV}/pool/gpu-0 (claim gpu): éé")
    assert message.endswith("... (and 1 more device: 1 Unknown)")


def test_the_condition_and_events_name_devices_with_one_helper() -> None:
    # Named by driver, pool and device, with the kubelet's resourceID beside it where it
    # differs (claims.device_name); the condition and the Events both go through it.
    state = podstatus.DeviceState(_key("gpu-7"), "cdi/gpu=7", "gpu", H.UNHEALTHY, "bad")
    assert podstatus.device_name(state) == f"{DRV}/pool/gpu-7 (as cdi/gpu=7)"
    plain = podstatus.DeviceState(_key("gpu-7"), f"{DRV}/pool/gpu-7", "gpu", H.UNHEALTHY, "")
    assert podstatus.device_name(plain) == f"{DRV}/pool/gpu-7"

"""How the condition and Events name a device: ``<driver>/<pool>/<device>``, with the
kubelet's resourceID beside it where it differs (issue 19, ``docs/pod-status.md``)."""

from __future__ import annotations

from typing import Any

from kubelet_dra import models
from kubelet_dra.kube import events
from kubelet_dra.status import claims, podstatus
from tests.unit import _podstatus_builders as b

H = models.HealthStatus
GPU, TPU = "gpu.example.com", "tpu.google.com"


def _desired(devices: list[claims.PreparedDevice], table: dict[str, H]) -> podstatus.Desired:
    pod = b.pod(
        claims=[{"name": "acc", "resourceClaimName": "acc-claim"}],
        containers=[b.container("main", ("acc", ""))],
        container_statuses=[{"name": "main"}],
    )
    index = claims.ClaimIndex()
    index.set_pod(pod)
    index.add_prepared_claim(namespace="default", name="acc-claim", devices=devices)
    health: dict[models.DeviceKey, Any] = {
        d.key: b.record(table.get(d.device, H.HEALTHY), "") for d in devices
    }
    return podstatus.desired_status(
        pod, index=index, health_of=b.health_map(health), now=b.NOW, condition_type="T"
    )


def test_condition_names_the_device_and_the_kubelets_id() -> None:
    devices = [
        claims.PreparedDevice(GPU, "node", "gpu-0", cdi_ids=("vendor.com/gpu=gpu0",)),
        claims.PreparedDevice(GPU, "node", "gpu-1"),
    ]
    desired = _desired(devices, {"gpu-0": H.UNHEALTHY, "gpu-1": H.UNHEALTHY})
    assert desired.condition is not None
    assert desired.condition["message"] == (
        "Unhealthy devices: gpu.example.com/node/gpu-0 (as vendor.com/gpu=gpu0) (claim acc); "
        "gpu.example.com/node/gpu-1 (claim acc)"
    )


def test_condition_and_events_name_a_chip_the_kubelet_would_hide() -> None:
    chips = [
        claims.PreparedDevice(TPU, "node", f"chip-{i}", cdi_ids=("g/tpu=common", f"g/tpu={i}"))
        for i in range(4)
    ]
    desired = _desired(chips, {"chip-2": H.UNHEALTHY})
    assert desired.condition is not None
    assert desired.condition["message"] == (
        "Unhealthy devices: tpu.google.com/node/chip-2 (as g/tpu=common, ours g/tpu=2) (claim acc)"
    )
    seen: dict[models.DeviceKey, H] = {}
    news = list(events.health_transitions(desired.devices, seen, set()))
    assert [m for _, _, m in news] == [
        "Device tpu.google.com/node/chip-2 (as g/tpu=common, ours g/tpu=2) (claim acc) is Unhealthy"
    ]

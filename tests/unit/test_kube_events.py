"""Event series: a create whose earlier attempt already landed becomes an update."""

from __future__ import annotations

from typing import Any

from kubelet_dra import errors, models
from kubelet_dra.clock import FakeClock
from kubelet_dra.kube import api as kube_api
from kubelet_dra.kube import events as _kube_events
from kubelet_dra.status import podstatus

H = models.HealthStatus
POD = {"kind": "Pod", "name": "p", "namespace": "default", "uid": "u1"}


class Api:
    def __init__(self, *, create_status: int | None) -> None:
        self.create_status = create_status
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    async def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", body["metadata"]["name"], body))
        if self.create_status is not None:
            raise errors.ApiError("already exists", status=self.create_status)
        return body

    async def patch(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch", name, body))
        return body


async def test_already_exists_on_create_is_patched_not_lost() -> None:
    clock = FakeClock()
    recorder = _kube_events.EventRecorder(node="n", clock=clock, interval=0)
    api = Api(create_status=409)
    recorder.record(POD, _kube_events.DEVICE_UNHEALTHY, "gpu-0 Unhealthy")
    await recorder.flush(api.create, api.patch)
    assert [c[0] for c in api.calls] == ["create", "patch"]
    assert api.calls[0][1] == api.calls[1][1]
    recorder.record(POD, _kube_events.DEVICE_UNHEALTHY, "gpu-0 Unhealthy again")
    clock.advance(1)
    await recorder.flush(api.create, api.patch)
    assert api.calls[-1][0] == "patch"
    assert api.calls[-1][2]["count"] == 2
    assert recorder.pending() == 0


async def test_other_create_errors_give_the_occurrence_up() -> None:
    recorder = _kube_events.EventRecorder(node="n", clock=FakeClock(), interval=0)
    api = Api(create_status=403)
    recorder.record(POD, _kube_events.DEVICE_UNHEALTHY, "gpu-0 Unhealthy")
    await recorder.flush(api.create, api.patch)
    assert [c[0] for c in api.calls] == ["create"]
    assert recorder.pending() == 0


async def test_transient_failure_waits_an_interval_before_retrying() -> None:
    clock = FakeClock()
    recorder = _kube_events.EventRecorder(node="n", clock=clock, interval=60)
    attempts = 0

    async def create(namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        nonlocal attempts
        attempts += 1
        raise kube_api.CallError("connection refused", status=None)  # what the API raises

    api = Api(create_status=None)
    recorder.record(POD, _kube_events.DEVICE_UNHEALTHY, "gpu-0 Unhealthy")
    await recorder.flush(create, api.patch)
    assert recorder.next_due() == clock.now() + 60
    await recorder.flush(create, api.patch)  # not due yet: no second attempt
    assert attempts == 1
    clock.advance(61)
    await recorder.flush(api.create, api.patch)
    assert [c[0] for c in api.calls] == ["create"]
    assert recorder.next_due() is None


def test_health_transitions_announce_news_only() -> None:
    key = models.DeviceKey("drv", "pool", "gpu-0")
    seen: dict[models.DeviceKey, models.HealthStatus] = {}
    known: set[models.DeviceKey] = set()

    def look(health: models.HealthStatus, message: str = "") -> list[tuple[str, str, str]]:
        device = podstatus.DeviceState(key, "drv/pool/gpu-0", "gpu", health, message)
        return list(_kube_events.health_transitions([device], seen, known))

    assert look(H.UNKNOWN) == []  # a fresh pod: no news yet
    assert look(H.HEALTHY) == []  # first known state, and a boring one
    assert look(H.HEALTHY) == []  # unchanged
    assert look(H.UNHEALTHY, "ECC") == [
        (_kube_events.DEVICE_UNHEALTHY, "Warning", f"Device {key} (claim gpu) is Unhealthy: ECC")
    ]
    assert [r for r, _, _ in look(H.UNKNOWN)] == [_kube_events.DEVICE_HEALTH_UNKNOWN]
    assert [(r, k) for r, k, _ in look(H.HEALTHY)] == [(_kube_events.DEVICE_HEALTHY, "Normal")]


def test_a_first_unhealthy_report_is_news() -> None:
    key = models.DeviceKey("drv", "pool", "gpu-0")
    device = podstatus.DeviceState(key, "drv/pool/gpu-0", "gpu", H.UNHEALTHY, "")
    assert [r for r, _, _ in _kube_events.health_transitions([device], {}, set())] == [
        _kube_events.DEVICE_UNHEALTHY
    ]

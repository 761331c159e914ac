"""What the real kubelet does with device health, with no sidecar: the premises of coexistence.

Each fact here is one the sidecar's modes rely on (docs/sidecar.md); if a kubelet line
changes it, this file says so first.

- Gate on: the kubelet writes ``allocatedResourcesStatus`` itself, naming each device by the
  first CDI device ID its driver returned from ``NodePrepareResources``.
- Gate on: devices of one claim that share their first CDI ID become one resource in the
  kubelet's field, so a failure of any but the first is hidden there.
- Gate off: the kubelet's status reconcile removes a field someone else wrote (the
  ``containerStatuses`` list is atomic and the kubelet patches all of it), and keeps a pod
  condition someone else wrote.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e import _dra
from tests.e2e._api import STRATEGIC
from tests.e2e.conftest import MESSAGE_GATE_LINES


def test_gate_on_kubelet_names_devices_by_first_cdi_id(node_setup):
    world = node_setup(gate=True)
    world.create_pod("p", ["gpu-0"])
    world.running("p")
    cdi = f"{_dra.DRIVER}/gpu=gpu-0"
    _dra.wait(lambda: _dra.field_health(world.pod("p")) == {cdi: "Healthy"}, 60,
              "the kubelet's field, Healthy, named by the CDI ID")  # fmt: skip
    world.flip("gpu-0", "UNHEALTHY", "ECC error")
    _dra.wait(lambda: _dra.field_health(world.pod("p")) == {cdi: "Unhealthy"}, 60,
              "the kubelet's field Unhealthy")  # fmt: skip


# A line that writes no messages shows nothing of having seen the report.
@pytest.mark.kubelet_lines(*sorted(MESSAGE_GATE_LINES))
def test_gate_on_kubelet_hides_devices_sharing_a_first_cdi_id(node_setup, line):
    chips = [
        _dra.Device(f"tpu-{i}", cdi_ids=(f"{_dra.DRIVER}/tpu=common", f"{_dra.DRIVER}/tpu=chip{i}"))
        for i in range(4)
    ]
    world = node_setup(gate=True, devices=chips)
    world.create_pod("p", [c.name for c in chips])
    world.running("p")
    common = f"{_dra.DRIVER}/tpu=common"
    _dra.wait(lambda: _dra.field_health(world.pod("p")) == {common: "Healthy"}, 60,
              "one resource for four chips")  # fmt: skip
    # One report: chip 2 fails, chip 0 (listed first) changes only its message. Once the
    # kubelet's field shows the new message it has seen the report, and still says Healthy.
    world.devices.set("tpu-0", "HEALTHY", "report 2")
    world.flip("tpu-2", "UNHEALTHY", "TPU device file is missing")
    resources = _dra.wait(
        lambda: [r for e in _dra.field(world.pod("p")) or () for r in e["resources"]
                 if r.get("message") == "report 2"],
        60, "the kubelet's field to show the second report",
    )  # fmt: skip
    assert [(r["resourceID"], r["health"]) for r in resources] == [(common, "Healthy")]


def test_gate_off_kubelet_removes_a_foreign_field_and_keeps_a_foreign_condition(node_setup):
    world = node_setup(gate=False)
    world.create_pod("p", ["gpu-0"])
    pod = world.running("p")
    statuses = pod["status"]["containerStatuses"]
    for cs in statuses:
        cs["allocatedResourcesStatus"] = [
            {
                "name": "claim:gpu",
                "resources": [
                    {"resourceID": f"{_dra.DRIVER}/{world.kubelet.node}/gpu-0", "health": "Unknown"}
                ],
            }
        ]
    condition = {"type": "ForeignCheck", "status": "True", "reason": "Test",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    world.api.patch(
        f"/api/v1/namespaces/{world.namespace}/pods/p/status",
        {"status": {"containerStatuses": statuses, "conditions": [condition]}},
        STRATEGIC,
    )
    written = time.monotonic()
    assert _dra.field(world.pod("p"))
    _dra.wait(lambda: _dra.field(world.pod("p")) is None, 45, "the kubelet to remove the field")
    removed_after = time.monotonic() - written
    assert _dra.condition(world.pod("p"), "ForeignCheck") is not None
    line = world.kubelet.spec.line
    print(f"kubelet {line} gate off removed the field after {removed_after:.1f}s")

"""Device names beside a real kubelet: ours match its field, and never hide a failed device.

The kubelet names a device by the first CDI device ID of its prepare answer (read by the
sidecar from the kubelet's ``dra_manager_state``). A driver that gives every chip of a claim
the same first CDI ID (the TPU driver's ``tpu=common``) makes the kubelet's field show one
resource for all of them, with the first chip's health. Our condition names each device as
``<driver>/<pool>/<device>`` with the kubelet's ID beside it; where we write the field, each
device gets an ID of its own.

Kubelet 1.35 (and 1.34) does not deduplicate: it lists every chip under the shared ID, and
the API server refuses its whole status patch (``resourceID: Duplicate value``), again at
every reconcile. The pod runs on the node but never shows ``Running``; nothing of the
kubelet's status reaches the API, only our condition does.
"""

from __future__ import annotations

import time

from tests.e2e import _dra
from tests.e2e.conftest import DUPLICATE_ID_LINES


def chips(n: int = 4) -> list[_dra.Device]:
    return [
        _dra.Device(f"tpu-{i}", cdi_ids=(f"{_dra.DRIVER}/tpu=common", f"{_dra.DRIVER}/tpu=chip{i}"))
        for i in range(n)
    ]


def kubelet_refused(audit, world, name: str) -> list[int]:
    user = f"system:node:{world.kubelet.node}"
    return [w.code for w in audit.writes(world.namespace, name) if w.user == user and w.code >= 400]


def test_gate_on_our_condition_names_the_failed_chip_the_kubelet_hides(node_setup, audit):
    world = node_setup(gate=True, devices=chips())
    sidecar = world.sidecar("auto")
    world.create_pod("p", [f"tpu-{i}" for i in range(4)])
    duplicates = world.kubelet.spec.line in DUPLICATE_ID_LINES
    if duplicates:
        _dra.wait(lambda: len(kubelet_refused(audit, world, "p")) >= 2, 60,
                  "the kubelet's status patches refused twice")  # fmt: skip
        assert set(kubelet_refused(audit, world, "p")) == {422}
        assert _dra.phase(world.pod("p")) != "Running"
    else:
        world.running("p")
    world.flip("tpu-2", "UNHEALTHY", "TPU device file is missing")
    # The sidecar reads the kubelet's checkpoint every 2 s: a failure that comes first is
    # named without the kubelet's IDs until the next read rewrites the message.
    cond = sidecar.until(
        lambda: (c := _dra.condition(world.pod("p"))) and c.get("status") == "False"
        and "tpu=chip2" in c.get("message", "") and c, 60,
        "our condition False, naming tpu=chip2",
        detail=lambda: f"condition: {_dra.condition(world.pod('p'))}",
    )  # fmt: skip
    node = world.kubelet.node
    assert f"{_dra.DRIVER}/{node}/tpu-2" in cond["message"], cond
    if duplicates:
        time.sleep(11)  # a status reconcile of the kubelet after the failure: still refused
        assert _dra.field(world.pod("p")) is None and _dra.phase(world.pod("p")) != "Running"
        return
    # The kubelet's field: one resource, Healthy (chip 0's health).
    assert _dra.field_health(world.pod("p")) == {f"{_dra.DRIVER}/tpu=common": "Healthy"}


def test_gate_off_our_field_gives_each_chip_an_id_of_its_own(node_setup):
    world = node_setup(gate=False, devices=chips())
    sidecar = world.sidecar("on")
    world.create_pod("p", [f"tpu-{i}" for i in range(4)])
    world.running("p")
    world.flip("tpu-2", "UNHEALTHY", "TPU device file is missing")
    want = {
        f"{_dra.DRIVER}/tpu=chip0": "Healthy",  # its first CDI ID no other chip has
        f"{_dra.DRIVER}/tpu=chip1": "Healthy",
        f"{_dra.DRIVER}/tpu=chip2": "Unhealthy",
        f"{_dra.DRIVER}/tpu=chip3": "Healthy",
    }
    sidecar.until(lambda: _dra.field_health(world.pod("p")) == want, 60,
                  "our field with one ID per chip")  # fmt: skip

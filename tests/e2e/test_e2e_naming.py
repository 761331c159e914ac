"""Device names beside a real kubelet: ours match its field, and never hide a failed device.

The kubelet names a device by the first CDI device ID of its prepare answer (read by the
sidecar from the kubelet's own PodResources API, ``<root dir>/pod-resources/kubelet.sock``).
A driver that gives every chip of a claim the same first CDI ID (the TPU driver's
``tpu=common``) makes the kubelet's field show one resource for all of them, with the first
chip's health. Our condition names each device as
``<driver>/<pool>/<device>`` with the kubelet's ID beside it; where we write the field, each
device gets an ID of its own.

Kubelet 1.35 (and 1.34) does not deduplicate: it lists every chip under the shared ID, and
the API server refuses its whole status patch (``resourceID: Duplicate value``), again at
every reconcile. The pod runs on the node but never shows ``Running``; nothing of the
kubelet's status reaches the API, only our condition does.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.e2e import _dra
from tests.e2e.conftest import DUPLICATE_ID_LINES

KINDS = ("example", "shared-first-id")
LISTS_OK = 'kubelet_dra_pod_resources_calls_total{code="OK",method="List"}'
RECONNECTS = "kubelet_dra_pod_resources_reconnects_total"


def chips(n: int = 4) -> list[_dra.Device]:
    return [
        _dra.Device(f"tpu-{i}", cdi_ids=(f"{_dra.DRIVER}/tpu=common", f"{_dra.DRIVER}/tpu=chip{i}"))
        for i in range(n)
    ]


def devices_of(kind: str) -> list[_dra.Device]:
    """The example driver's devices (a CDI ID of their own each), or chips sharing their first."""
    return [_dra.Device(f"gpu-{i}") for i in range(3)] if kind == "example" else chips(3)


def condition_names(pod, node: str) -> dict[str, str]:
    """Device -> the kubelet's ID our condition names it by (``... (as <id>[, ours <id>])``)."""
    cond = _dra.condition(pod) or {}
    pattern = rf"{re.escape(_dra.DRIVER)}/{re.escape(node)}/([\w.-]+) \(as ([^,)]+)"
    return dict(re.findall(pattern, cond.get("message", "")))


def fail_all(world, devices: list[_dra.Device]) -> None:
    for d in devices:
        world.devices.set(d.name, "UNHEALTHY", f"{d.name} broken")
    _dra.apply(world.driver, world.devices)


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
    # The sidecar asks the kubelet's PodResources API for the pod on its API events: a
    # failure that comes first is named without the kubelet's IDs until the answer.
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


@pytest.mark.parametrize("kind", KINDS)
def test_gate_on_our_condition_names_every_device_as_the_kubelets_field(node_setup, kind):
    """Every device failed: the IDs our condition names them by are the kubelet's field's."""
    devices = devices_of(kind)
    world = node_setup(gate=True, devices=devices)
    sidecar = world.sidecar("auto")
    world.create_pod("p", [d.name for d in devices])
    node = world.kubelet.node
    firsts = {d.name: d.cdi(_dra.DRIVER)[0] for d in devices}
    fail_all(world, devices)
    names = sidecar.until(
        lambda: (n := condition_names(world.pod("p"), node)) == firsts and n, 90,
        "our condition naming every device by its first CDI ID",
        detail=lambda: f"condition: {_dra.condition(world.pod('p'))}",
    )  # fmt: skip
    if world.kubelet.spec.line in DUPLICATE_ID_LINES and kind != "example":
        return  # the kubelet's status never lands there (see the module docstring)
    field = _dra.wait(
        lambda: (h := _dra.field_health(world.pod("p"))) and set(h.values()) == {"Unhealthy"}
        and h, 90, "the kubelet's field Unhealthy",
    )  # fmt: skip
    assert set(field) == set(names.values()), (field, names)


@pytest.mark.parametrize("kind", KINDS)
def test_gate_off_our_field_and_condition_name_every_device_as_the_kubelet_does(node_setup, kind):
    """No kubelet field: ours carries the kubelet's first CDI IDs (own ones where shared)."""
    devices = devices_of(kind)
    world = node_setup(gate=False, devices=devices)
    sidecar = world.sidecar("on")
    world.create_pod("p", [d.name for d in devices])
    world.running("p")
    fail_all(world, devices)
    node = world.kubelet.node
    firsts = {d.name: d.cdi(_dra.DRIVER)[0] for d in devices}
    own = {d.cdi(_dra.DRIVER)[-1]: "Unhealthy" for d in devices}  # its last is its own
    sidecar.until(lambda: _dra.field_health(world.pod("p")) == own, 90,
                  "our field naming every device",
                  detail=lambda: str(world.pod("p")["status"]))  # fmt: skip
    assert condition_names(world.pod("p"), node) == firsts


def test_naming_comes_back_after_a_kubelet_restart_while_a_device_is_unhealthy(node_setup):
    """The kubelet restarts (its socket goes and comes back): the sidecar, not restarted,
    lists again, and a pod started after the restart is named by the new connection."""
    devices = [_dra.Device("gpu-0"), _dra.Device("gpu-1")]
    world = node_setup(gate=True, devices=devices)
    sidecar = world.sidecar("auto")
    node = world.kubelet.node
    world.create_pod("p", ["gpu-0"])
    world.running("p")
    world.flip("gpu-0", "UNHEALTHY", "ECC error")
    want_p = {"gpu-0": f"{_dra.DRIVER}/gpu=gpu-0"}
    sidecar.until(lambda: condition_names(world.pod("p"), node) == want_p, 60,
                  "our condition naming gpu-0 as the kubelet")  # fmt: skip
    lists = sidecar.metric(LISTS_OK)
    world.kubelet.restart()
    sidecar.until(lambda: sidecar.metric(RECONNECTS) >= 1 and sidecar.metric(LISTS_OK) > lists,
                  90, "a List on a new connection after the kubelet's restart")  # fmt: skip
    world.create_pod("q", ["gpu-1"])
    world.running("q", timeout=90)
    world.flip("gpu-1", "UNHEALTHY", "ECC error")
    sidecar.until(
        lambda: condition_names(world.pod("q"), node) == {"gpu-1": f"{_dra.DRIVER}/gpu=gpu-1"},
        60, "the new pod's device named as the kubelet names it",
        detail=lambda: f"condition: {_dra.condition(world.pod('q'))}",
    )  # fmt: skip
    assert condition_names(world.pod("p"), node) == want_p
    assert sidecar.metric('kubelet_dra_pod_resources_fallback{reason="no_dynamic_resources"}') == 0

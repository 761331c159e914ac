"""Our sidecar beside a real kubelet: who writes what, gate on and off, in each mode.

Writes are counted per user from the kube-apiserver's audit log. What each case must show
(docs/sidecar.md has the table this proves):

- gate on: the kubelet writes the field; ``auto`` and ``off`` never do, ``on`` writes the
  same names the kubelet does (so no war); our condition follows the kubelet's field. Where
  devices share their first CDI ID, ``on`` writes one ID per device and the kubelet one entry
  under the shared ID: ``on`` backs off each rewrite by the kubelet as it does a removal.
- gate off: the kubelet removes any field we write. ``auto`` sees that once, says so (log,
  metric, ``/readyz``, the Node Event ``KubeletRemovesResourceHealth``) and stops writing the
  field on the node; ``on`` rewrites with a per-pod backoff; ``off`` never writes it. The
  condition carries the device's health and message and survives the kubelet's patches.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from tests.e2e import _dra
from tests.e2e.conftest import DUPLICATE_ID_LINES, SIDECAR_USER
from tests.interop import _build

REMOVES_REASON = "KubeletRemovesResourceHealth"
CDI = f"{_dra.DRIVER}/gpu=gpu-0"


def sidecar_field_writes(audit, namespace: str, name: str, since: float = 0.0) -> int:
    return sum(
        1
        for w in audit.writes(namespace, name)
        if w.user == SIDECAR_USER and w.code < 400 and w.at >= since and w.sets_field()
    )


def kubelet_writes(audit, world, name: str, since: float = 0.0) -> int:
    user = f"system:node:{world.kubelet.node}"
    return sum(1 for w in audit.writes(world.namespace, name) if w.user == user and w.at >= since)


def unhealthy_condition(pod) -> bool:
    cond = _dra.condition(pod)
    return cond is not None and cond.get("status") == "False" and "gpu-0" in cond.get("message", "")


def node_events(api, node: str, reason: str) -> list[dict[str, object]]:
    found = api.get(f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D{node}")
    return [e for e in found.get("items", []) if e.get("reason") == reason]


def readyz(sidecar) -> str:
    url = sidecar.metrics_url().removesuffix("/metrics") + "/readyz?verbose"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return str(answer.read().decode())
    except urllib.error.HTTPError as exc:
        return str(exc.read().decode())


@pytest.mark.parametrize("mode", ["auto", "off", "on"])
def test_gate_on_the_kubelet_writes_the_field_and_we_never_fight_it(node_setup, audit, mode):
    world = node_setup(gate=True)
    sidecar = world.sidecar(mode)
    world.create_pod("p", ["gpu-0"])
    world.running("p")
    _dra.wait(lambda: _dra.field_health(world.pod("p")) == {CDI: "Healthy"}, 60, "kubelet field")
    world.flip("gpu-0", "UNHEALTHY", "ECC error")
    _dra.wait(lambda: _dra.field_health(world.pod("p")) == {CDI: "Unhealthy"}, 60, "Unhealthy")
    sidecar.until(lambda: unhealthy_condition(world.pod("p")), 30, "our condition False")
    since = time.time()
    time.sleep(25)  # two of the kubelet's status reconciles and five driver re-sends
    ours = sidecar_field_writes(audit, world.namespace, "p")
    if mode == "on":
        # Same names as the kubelet's: whatever we write, the kubelet finds its own value.
        assert sidecar_field_writes(audit, world.namespace, "p", since) == 0
    else:
        assert ours == 0
    assert _dra.field_health(world.pod("p")) == {CDI: "Unhealthy"}


def shared_first_id_chips(n: int = 4) -> list[_dra.Device]:
    """Chips whose prepare answers share their first CDI ID (the TPU driver's ``tpu=common``)."""
    return [
        _dra.Device(f"tpu-{i}", cdi_ids=(f"{_dra.DRIVER}/tpu=common", f"{_dra.DRIVER}/tpu=chip{i}"))
        for i in range(n)
    ]


#: The window after a chip fails. Without the backoff each side wrote every ~10 s: 12 each.
WAR_WINDOW = 120.0
#: Our field writes in any window of WAR_WINDOW: the backoff after each rewrite by the
#: kubelet is 10, 20, 40, 80 s..., so writes at 0, 10, 30, 70 s at the soonest, then 150 s.
WAR_BOUND = 4


#: Lines whose kubelet writes a field under a shared first CDI ID at all (on the others the
#: API server refuses its patch, ``DUPLICATE_ID_LINES``: nothing to rewrite, the pod never
#: shows Running; ``test_e2e_naming.py`` covers them).
SHARED_ID_FIELD_LINES = sorted(set(_build.KUBELET_LINES) - DUPLICATE_ID_LINES)


@pytest.mark.kubelet_lines(*SHARED_ID_FIELD_LINES)
@pytest.mark.timeout(WAR_WINDOW + 300)
def test_gate_on_on_backs_off_a_kubelet_that_rewrites_a_shared_id(node_setup, audit):
    world = node_setup(gate=True, devices=shared_first_id_chips())
    sidecar = world.sidecar("on")
    world.create_pod("p", [f"tpu-{i}" for i in range(4)])
    world.running("p")
    start = time.time()
    world.flip("tpu-2", "UNHEALTHY", "TPU device file is missing")
    sidecar.until(lambda: "tpu=chip2" in (_dra.condition(world.pod("p")) or {}).get(
        "message", ""), 60, "our condition naming tpu=chip2")  # fmt: skip
    time.sleep(max(0.0, start + WAR_WINDOW - time.time()))
    ours = sidecar_field_writes(audit, world.namespace, "p", start)
    theirs = kubelet_writes(audit, world, "p", start)
    rewrites = sidecar.metric("kubelet_dra_field_rewrites_total")
    print("\n" + json.dumps({"window_s": WAR_WINDOW, "ours_field": ours, "kubelet": theirs,
                             "field_rewrites_total": rewrites}))  # fmt: skip
    assert ours <= WAR_BOUND, f"a write war: ours {ours}, the kubelet's {theirs}"
    assert theirs <= ours + 1, f"a write war: ours {ours}, the kubelet's {theirs}"
    assert rewrites >= 1  # counted
    cond = _dra.condition(world.pod("p")) or {}
    assert cond.get("status") == "False" and "tpu=chip2" in cond.get("message", ""), cond


def test_gate_off_auto_stops_the_field_on_the_node_and_says_so_once(node_setup, audit, api):
    world = node_setup(gate=False)
    sidecar = world.sidecar("auto")
    world.create_pod("p", ["gpu-0"])
    world.running("p")
    world.flip("gpu-0", "UNHEALTHY", "ECC error")
    sidecar.until(lambda: unhealthy_condition(world.pod("p")), 30, "our condition False")
    events = sidecar.until(lambda: node_events(api, world.kubelet.node, REMOVES_REASON), 60,
                           f"the Node Event {REMOVES_REASON}")  # fmt: skip
    assert len(events) == 1
    assert not sidecar.grep("leaving that field to it")
    assert sidecar.grep("ResourceHealthStatus")
    assert REMOVES_REASON in readyz(sidecar) or "kubelet" in readyz(sidecar).lower()
    # From then on no field writes on this node, for this pod or a new one, while the
    # sidecar keeps writing: a new message reaches both pods' conditions, never the field.
    since = time.time()
    world.create_pod("q", ["gpu-0"])
    world.running("q")
    world.flip("gpu-0", "UNHEALTHY", "ECC error 2")
    for name in ("p", "q"):
        sidecar.until(lambda n=name: "ECC error 2" in (_dra.condition(world.pod(n)) or {}).get(
            "message", ""), 30, f"the new message in pod {name}'s condition")  # fmt: skip
    time.sleep(12)  # a status reconcile of the kubelet after it
    assert sidecar_field_writes(audit, world.namespace, "p", since) == 0
    assert sidecar_field_writes(audit, world.namespace, "q") == 0
    # The condition survives the kubelet's own status patches (it wrote q's phase meanwhile).
    assert kubelet_writes(audit, world, "q") >= 1
    assert unhealthy_condition(world.pod("p"))
    assert len(node_events(api, world.kubelet.node, REMOVES_REASON)) == 1


def test_gate_off_on_rewrites_with_a_per_pod_backoff(node_setup, audit):
    world = node_setup(gate=False)
    world.sidecar("on")
    world.create_pod("p", ["gpu-0"])
    world.running("p")
    world.flip("gpu-0", "UNHEALTHY", "ECC error")
    _dra.wait(lambda: sidecar_field_writes(audit, world.namespace, "p") >= 1, 60, "a field write")
    start = time.time()
    time.sleep(60)
    # Without a backoff: one rewrite per kubelet reconcile (every ~10 s), 6 a minute.
    rewrites = sidecar_field_writes(audit, world.namespace, "p", start)
    assert rewrites <= 3, rewrites
    assert unhealthy_condition(world.pod("p"))


def test_gate_off_off_writes_only_the_condition(node_setup, audit):
    world = node_setup(gate=False)
    sidecar = world.sidecar("off")
    world.create_pod("p", ["gpu-0"])
    world.running("p")
    world.flip("gpu-0", "UNHEALTHY", "ECC error")
    sidecar.until(lambda: unhealthy_condition(world.pod("p")), 30, "our condition False")
    time.sleep(15)
    assert sidecar_field_writes(audit, world.namespace, "p") == 0
    assert unhealthy_condition(world.pod("p"))

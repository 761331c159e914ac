"""A pod that fails on a failed device, beside a real kubelet (kubernetes #132978 is open).

The question a person asks after a batch pod died is "was it the hardware?". The kubelet
forgets a terminated pod's devices when it unprepares its claims, so what its field says
afterwards is whatever it last wrote, or nothing. This test measures what the real kubelet
leaves (printed, and quoted in docs/sidecar.md), and proves that our condition keeps the
health the devices had when the pod failed, even after the device recovers.
"""

from __future__ import annotations

import time

from tests.e2e import _dra

CDI = f"{_dra.DRIVER}/gpu=gpu-0"


def test_failed_pod_keeps_its_failure_time_health(node_setup, audit):
    world = node_setup(gate=True)
    sidecar = world.sidecar("auto")
    world.create_pod("job", ["gpu-0"])
    world.running("job")
    world.flip("gpu-0", "UNHEALTHY", "XID 79: GPU has fallen off the bus")
    _dra.wait(lambda: _dra.field_health(world.pod("job")).get(CDI) == "Unhealthy", 60,
              "the kubelet's field Unhealthy")  # fmt: skip
    sidecar.until(lambda: (_dra.condition(world.pod("job")) or {}).get("status") == "False", 30,
                  "our condition False")  # fmt: skip
    world.kubelet.exit_container(world.namespace, "job", _dra.CONTAINER, 1)
    _dra.wait(lambda: _dra.phase(world.pod("job")) == "Failed", 60, "the pod Failed")
    failed_at = time.time()
    at_failure = _dra.field(world.pod("job"))
    # The device recovers; a new report reaches both the kubelet and us.
    world.flip("gpu-0", "HEALTHY", "recovered")
    probe = world.create_pod("probe", ["gpu-0"])
    assert probe
    world.running("probe")
    _dra.wait(lambda: _dra.field_health(world.pod("probe")).get(CDI) == "Healthy", 60,
              "a running pod's field Healthy again (the kubelet saw the recovery)")  # fmt: skip
    sidecar.until(lambda: (_dra.condition(world.pod("probe")) or {}).get("status") == "True", 30,
                  "our condition True on the running pod")  # fmt: skip
    failed = world.pod("job")
    print(f"\nthe kubelet's field at failure: {at_failure}")
    print(f"the kubelet's field after recovery: {_dra.field(failed)}")
    kubelet = f"system:node:{world.kubelet.node}"
    after = [
        w for w in audit.writes(world.namespace, "job") if w.user == kubelet and w.at > failed_at
    ]
    print(f"the kubelet's status writes of the failed pod in the {time.time() - failed_at:.0f}s "
          f"after it failed: {len(after)}")  # fmt: skip
    cond = _dra.condition(failed)
    assert cond is not None and cond["status"] == "False", cond
    assert "fallen off the bus" in cond.get("message", "")

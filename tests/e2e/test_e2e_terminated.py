"""A pod that fails on a failed device, beside a real kubelet (kubernetes #132978 is open).

The question a person asks after a batch pod died is "was it the hardware?". The kubelet
forgets a terminated pod's devices when it unprepares its claims. This test asserts what the
real kubelet does to the failed pod's status afterwards, as facts of the lines it runs on
(docs/sidecar.md quotes them): it writes that status no more once it wrote the phase
``Failed``, so its field stays as it was then, also after the device recovers. A later line
may change that; the test then fails with ``KUBELET FACT CHANGED`` and the kubelet's version,
not as a fault of ours. And it proves that our condition keeps the health the devices had
when the pod failed, even after the device recovers.
"""

from __future__ import annotations

import json
import time

from tests.e2e import _dra, _node
from tests.interop import _build

CDI = f"{_dra.DRIVER}/gpu=gpu-0"


def kubelet_fact(holds: bool, line: str, fact: str, seen: str) -> None:
    """Fail, saying that the kubelet changed, when a fact of its lines no longer holds."""
    if not holds:
        version = _build.KUBELET_LINES[line][1]
        raise AssertionError(
            f"KUBELET FACT CHANGED: on kubelet {version}, not so: {fact}. This run saw {seen}. "
            "This is the kubelet's behaviour, not the sidecar's: measure this line, then "
            "update 'Terminated pods' in docs/sidecar.md and this test."
        )


def writes_after_failed(writes: list[_node.StatusWrite]) -> list[_node.StatusWrite] | None:
    """The writes after the first one that set the phase ``Failed`` (None: no such write)."""
    ordered = sorted(writes, key=lambda w: w.at)
    for i, write in enumerate(ordered):
        if '"phase": "Failed"' in json.dumps(write.body):
            return ordered[i + 1 :]
    return None


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
    after = writes_after_failed([w for w in audit.writes(world.namespace, "job")
                                 if w.user == kubelet])  # fmt: skip
    assert after is not None, "no status write of the kubelet set the phase Failed"
    print(f"the kubelet's status writes of the failed pod in the {time.time() - failed_at:.0f}s "
          f"after it failed: {len(after)}")  # fmt: skip
    line = world.kubelet.spec.line
    first = f", the first {after[0].at - failed_at:+.1f}s after we saw it Failed" if after else ""
    kubelet_fact(
        not after, line, "the kubelet writes a failed pod's status no more after the phase Failed",
        f"{len(after)} writes after that{first}",
    )  # fmt: skip
    kubelet_fact(
        _dra.field(failed) == at_failure, line,
        "the kubelet keeps a failed pod's allocatedResourcesStatus as it was at the failure",
        f"{at_failure} at failure, {_dra.field(failed)} after the device recovered",
    )  # fmt: skip
    cond = _dra.condition(failed)
    assert cond is not None and cond["status"] == "False", cond
    assert "fallen off the bus" in cond.get("message", "")

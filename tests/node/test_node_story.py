"""The device-failure story on a node where pods really run (issue 41, point 3, steps 1-4).

A Job's pod holds a claim for one device; its container opens the device in a loop. The
device fails (its node goes, the driver streams Unhealthy with a message); the workload sees
it and exits 42. Within :data:`BOUND` seconds the pod shows the kubelet's
``allocatedResourcesStatus`` and our ``DeviceHealthy=False`` naming the device as the kubelet
does, and the container's real ``terminated`` state. The real Job controller then applies
docs/remediation.md's podFailurePolicy: that failure is not counted against
``backoffLimit: 0``, a failure of the workload's own (exit 3, device Healthy) is.
tests/node/_story.py says how the device fails and why that way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubelet_dra.status.podjson import MutableObj as Obj
from tests.e2e import _dra
from tests.node import _story

#: Seconds from the device failing until the pod shows all of it (measured: see docs/node.md).
BOUND = 30.0


def marks(
    get: Callable[[], Obj], probes: dict[str, Callable[[Obj], bool]], timeout: float
) -> dict[str, tuple[float, Obj]]:
    """Poll the pod until each probe has been true of it once; returns when each first was
    (Unix seconds) and the pod as it was then."""
    seen: dict[str, tuple[float, Obj]] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(probes) and time.monotonic() < deadline:
        try:
            pod, at = get(), time.time()
        except Exception:  # a pod not there yet
            pod = None
        for name, probe in probes.items():
            if pod is not None and name not in seen and probe(pod):
                seen[name] = (at, pod)
        time.sleep(0.1)
    missing = sorted(set(probes) - set(seen))
    assert not missing, f"not seen within {timeout:.0f}s: {missing} (seen: {sorted(seen)})"
    return seen


def since(seen: dict[str, tuple[float, Obj]], start: float) -> dict[str, float]:
    """The marks in order, as seconds after ``start``."""
    return {k: round(at - start, 2) for k, (at, _) in sorted(seen.items(), key=lambda i: i[1][0])}


def unhealthy_field(pod: Obj) -> bool:
    return any(r["health"] == "Unhealthy" for r in shows_the_failure(pod)["field"])


def condition_false(pod: Obj) -> bool:
    return _story.condition_of(pod).get("status") == "False"


def running_and_open(world: _story.Story, pod: Callable[[], Obj]) -> Obj:
    """Step 1: the pod runs and its workload has opened the device."""
    return _dra.wait(
        lambda: (p := pod()) and _dra.phase(p) == "Running" and "opened" in world.log(p) and p,
        120, "the workload running with its device open",
    )  # fmt: skip


def shows_the_failure(pod: Obj) -> dict[str, Any]:
    """Step 3's facts of one pod version: the field, our condition, the container's state."""
    field = [r for entry in _dra.field(pod) or () for r in entry.get("resources") or ()]
    return {"field": field, "condition": _story.condition_of(pod),
            "terminated": _story.terminated(pod), "last": _story.terminated(pod, last=True),
            "restarts": _story.restart_count(pod)}  # fmt: skip


def assert_device_named(facts: dict[str, Any]) -> None:
    """The kubelet's entry is Unhealthy with the driver's message; our condition is False
    and names the device by the kubelet's resourceID, so a reader finds the entry."""
    (resource,) = facts["field"]
    assert resource["health"] == "Unhealthy", facts
    assert resource.get("message") == _story.MESSAGE, facts
    cond = facts["condition"]
    assert cond.get("status") == "False" and cond.get("reason") == "DeviceUnhealthy", cond
    assert f"(as {resource['resourceID']})" in cond.get("message", ""), (cond, resource)
    assert _story.MESSAGE in cond.get("message", ""), cond


def test_device_failure_is_not_counted_by_the_job(story: Callable[..., _story.Story]) -> None:
    world = story()
    world.create_job("train", _story.workload(150))

    def first() -> Obj:
        return world.job_pods("train")[0]

    pod = running_and_open(world, first)
    name = pod["metadata"]["name"]
    failed_at = world.fail_device()
    seen = marks(lambda: world.api.get(f"/api/v1/namespaces/{world.namespace}/pods/{name}"), {
        "field Unhealthy": unhealthy_field,
        "condition False": condition_false,
        "container terminated": lambda p: _story.terminated(p) is not None,
        "pod Failed": lambda p: _dra.phase(p) == "Failed",
    }, BOUND)  # fmt: skip
    failed = world.api.get(f"/api/v1/namespaces/{world.namespace}/pods/{name}")
    # The kubelet's field as it showed the failure; our condition as the failed pod keeps it.
    facts = {**shows_the_failure(seen["field Unhealthy"][1]),
             "condition": _story.condition_of(failed)}  # fmt: skip
    assert_device_named(facts)
    facts = shows_the_failure(failed)
    assert facts["terminated"]["exitCode"] == _story.DEVICE_LOST, facts
    assert facts["terminated"]["reason"] == "Error", facts
    assert "device lost" in world.log(failed)
    # Step 4: the Job controller ignores it; with backoffLimit 0 a counted failure fails it.
    world.restore_device()
    job = _dra.wait(
        lambda: (j := world.job("train")) and _story.job_condition(j, "Complete") and j,
        180, "the Job to complete on its replacement pod",
    )  # fmt: skip
    assert _story.job_condition(job, "Failed") is None, job["status"]
    assert job["status"].get("failed", 0) == 0, job["status"]
    assert job["status"].get("succeeded") == 1, job["status"]
    pods = world.job_pods("train")
    assert len(pods) >= 2 and _dra.phase(pods[-1]) == "Succeeded", [_dra.phase(p) for p in pods]
    done = world.api.get(f"/api/v1/namespaces/{world.namespace}/pods/"
                         f"{pods[-1]['metadata']['name']}")  # fmt: skip
    replacement_running = _dra.condition(done, "Ready") or {}
    print(f"\nfrom the device failing (s): {since(seen, failed_at)}")
    print(f"kubelet field at failure: {seen['field Unhealthy'][1]['status']['containerStatuses']}")
    print(f"our condition: {_story.condition_of(failed)}")
    print(f"replacement {done['metadata']['name']} created "
          f"{done['metadata']['creationTimestamp']}, ready {replacement_running}; "
          f"job completed {_story.job_condition(job, 'Complete')}")  # fmt: skip


def test_workload_failure_is_counted_by_the_job(story: Callable[..., _story.Story]) -> None:
    world = story()
    world.create_job("buggy", _story.workload(30, code=3))
    job = _dra.wait(
        lambda: (j := world.job("buggy")) and _story.job_condition(j, "Failed") and j,
        180, "the Job to fail",
    )  # fmt: skip
    failed = _story.job_condition(job, "Failed") or {}
    assert failed.get("reason") == "BackoffLimitExceeded", job["status"]
    assert job["status"].get("failed") == 1, job["status"]
    (pod,) = world.job_pods("buggy")
    facts = shows_the_failure(pod)
    assert facts["terminated"]["exitCode"] == 3, facts
    assert "opened" in world.log(pod) and "device lost" not in world.log(pod)
    assert not unhealthy_field(pod), facts
    # The device was Healthy all along: our condition says so (it may land after the fail).
    name = pod["metadata"]["name"]
    healthy = _dra.wait(
        lambda: _story.condition_of(world.api.get(
            f"/api/v1/namespaces/{world.namespace}/pods/{name}")).get("status") == "True",
        30, "our condition True on the failed pod",
    )  # fmt: skip
    assert healthy


def test_restarted_container_on_a_failed_device(story: Callable[..., _story.Story]) -> None:
    world = story()
    world.create_pod("restarts", _story.workload(100_000), restart="OnFailure")

    def pod() -> Obj:
        return world.api.get(f"/api/v1/namespaces/{world.namespace}/pods/restarts")

    running_and_open(world, pod)
    failed_at = world.fail_device()
    seen = marks(pod, {
        "field Unhealthy": unhealthy_field,
        "condition False": condition_false,
        "restarted": lambda p: _story.restart_count(p) >= 1,
    }, BOUND)  # fmt: skip
    facts = shows_the_failure(pod())
    assert_device_named(facts)
    assert facts["last"]["exitCode"] == _story.DEVICE_LOST, facts
    assert _dra.phase(pod()) == "Running", facts  # OnFailure: the kubelet restarts it
    print(f"\nfrom the device failing (s): {since(seen, failed_at)}")
    # Step 6: the pod goes; nothing of it is left on the node.
    uid = pod()["metadata"]["uid"]
    ids = _story.leftovers(world, uid)["containers"]
    assert len(ids) >= 2, f"containerd lists {ids} for the pod (a sandbox and a container)"
    deleted_at = time.monotonic()
    world.delete_pods()
    _dra.wait(lambda: not any(_story.leftovers(world, uid, ids).values()), 150,
              "nothing of the pod left on the node", interval=1.0)  # fmt: skip
    print(f"nothing left {time.monotonic() - deleted_at:.1f}s after the pod was deleted")

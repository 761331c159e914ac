"""A node agent that is not async: the manager on its own thread (``SyncRunner``).

The same pipeline as ``node_agent.py``: claims are added programmatically and
desired statuses arrive through a callback, here a plain function that puts
them on a ``queue.Queue`` which the agent's own thread reads. The fake driver
runs on the manager's event loop, reached through ``runner.call``. Run it with
``python docs/examples/node_agent_sync.py``.
"""

from __future__ import annotations

import pathlib
import queue
import shutil
import tempfile

import kubelet_dra
from kubelet_dra.testing import FakeDriver, make_pod

DRIVER = "gpu.example.com"
NODE = "node-1"


def wait_for_health(updates: queue.Queue[kubelet_dra.PodHealthUpdate], wanted: str) -> None:
    """Read updates until the pod's device shows ``wanted``; print each one."""
    while True:
        update = updates.get(timeout=10)
        for state in update.desired.devices:
            print(
                f"{update.pod_uid}: {state.resource_id} is {state.health} {state.message}".strip()
            )
        if [s.health for s in update.desired.devices] == [wanted]:
            return


def main(root: pathlib.Path) -> None:
    settings = kubelet_dra.Settings(
        node_name=NODE,
        plugins_registry=root / "registry",
        state_dir=root / "state",
        registry_poll_interval=0.1,
    )
    updates: queue.Queue[kubelet_dra.PodHealthUpdate] = queue.Queue()
    manager = kubelet_dra.DRAHealthManager(settings, on_status=updates.put)
    driver = FakeDriver(DRIVER, registry=root / "registry")
    pod = make_pod("train-0", NODE, claims=["train-0-gpu"])
    pod["metadata"]["uid"] = "uid-train-0"

    with kubelet_dra.SyncRunner(manager) as runner:
        runner.call(
            lambda: manager.add_prepared_claim(
                namespace="default",
                name="train-0-gpu",
                devices=[kubelet_dra.PreparedDevice(DRIVER, "pool", "gpu-0")],
                pod_uids=["uid-train-0"],
            )
        )
        runner.call(manager.set_pod, pod)
        runner.call(driver.start)
        try:
            runner.call(driver.set_health, {"pool": "pool", "device": "gpu-0"})
            wait_for_health(updates, "Healthy")
            runner.call(
                driver.set_health,
                {"pool": "pool", "device": "gpu-0", "health": "Unhealthy", "message": "fan"},
            )
            wait_for_health(updates, "Unhealthy")
            desired = runner.call(manager.desired, "uid-train-0")
        finally:
            # The manager first: a driver going away under a running manager is
            # a failure it would log; SyncRunner's own close is then a no-op.
            runner.call(manager.close)
            runner.call(driver.stop)
    print(f"condition: {desired.condition['status']} ({desired.condition['reason']})")


if __name__ == "__main__":
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="kd"))
    try:
        main(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

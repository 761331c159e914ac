"""A node agent that owns pod status, using kubelet-dra as a library (asyncio).

The agent (a virtual-kubelet style provider, say) knows its pods and prepares
their claims itself, so it gives the manager both programmatically and
receives each pod's desired device status through a callback, which it merges
into the status it writes. A ``FakeDriver`` stands in for a real DRA driver;
nothing else is needed. Run it with ``python docs/examples/node_agent.py``.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import kubelet_dra
from kubelet_dra.testing import FakeDriver, make_pod

DRIVER = "gpu.example.com"
NODE = "node-1"


class PodStore:
    """The agent's own copy of its pods; a real agent would write them to the API."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.changed = asyncio.Condition()

    async def on_status(self, update: kubelet_dra.PodHealthUpdate) -> None:
        """The manager's callback: merge the desired device status into ours."""
        pod = self.pods[update.pod_uid]
        pod["status"], changed = kubelet_dra.merge_pod_status(
            pod["status"], update.desired, now=time.time()
        )
        if changed:
            for state in update.desired.devices:
                line = f"{pod['metadata']['name']}: {state.resource_id} is {state.health}"
                print(line + (f" ({state.message})" if state.message else ""), flush=True)
        async with self.changed:
            self.changed.notify_all()

    async def wait_for(self, uid: str, check: Callable[[list[str]], bool]) -> None:
        """Wait until the health values in this pod's status pass ``check``."""

        def healths() -> list[str]:
            containers = self.pods[uid]["status"].get("containerStatuses", [])
            entries = [
                entry
                for container in containers
                if container["name"] == "main"
                for entry in container.get("allocatedResourcesStatus", [])
            ]
            return [r["health"] for e in entries for r in e.get("resources", [])]

        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(lambda: check(healths())), 10)


async def main(root: pathlib.Path) -> None:
    settings = kubelet_dra.Settings(
        node_name=NODE,
        plugins_registry=root / "registry",
        state_dir=root / "state",
        # The agent acts as the kubelet: it answers NotifyRegistrationStatus.
        role=kubelet_dra.Role.OWNER,
        registry_poll_interval=0.1,
    )
    store = PodStore()
    pod = make_pod("train-0", NODE, claims=["train-0-gpu"])
    uid = pod["metadata"]["uid"] = "uid-train-0"
    store.pods[uid] = pod

    async with (
        FakeDriver(DRIVER, registry=root / "registry") as driver,
        kubelet_dra.DRAHealthManager(settings, on_status=store.on_status) as manager,
    ):
        # What NodePrepareResources returned for the pod's claim.
        manager.add_prepared_claim(
            namespace="default",
            name="train-0-gpu",
            devices=[kubelet_dra.PreparedDevice(DRIVER, "pool", "gpu-0", cdi_ids=("gpu=0",))],
            pod_uids=[uid],
        )
        manager.set_pod(pod)

        await driver.set_health({"pool": "pool", "device": "gpu-0", "health": "Healthy"})
        await store.wait_for(uid, lambda h: h == ["Healthy"])
        await driver.set_health(
            {"pool": "pool", "device": "gpu-0", "health": "Unhealthy", "message": "XID 79"}
        )
        await store.wait_for(uid, lambda h: h == ["Unhealthy"])
        registered = driver.notifications

    status = store.pods[uid]["status"]
    print("allocatedResourcesStatus:")
    print(json.dumps(status["containerStatuses"][0]["allocatedResourcesStatus"], indent=2))
    condition = next(c for c in status["conditions"] if c["type"] == settings.pod_condition_type)
    print(f"condition {condition['type']}={condition['status']} ({condition['reason']})")
    print(f"driver told it was registered: {registered == [(True, '')]}")


if __name__ == "__main__":
    # Unix socket paths are short: keep the directory near the root of TMPDIR.
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="kd"))
    try:
        asyncio.run(main(workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

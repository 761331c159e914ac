"""Clusters for the ``kubectl dra-health`` tests, written into a FakeApiServer.

:func:`demo_scenario` is the demo's cluster (``kubelet_dra.demo``: three training pods on
``demo-node``, four GPUs of ``gpu.example.com``) at the moment gpu-1 turned Unhealthy and
gpu-3's lease ran out, with the status our writer produces (``podstatus``) and its condition.
The README's ``kubectl dra-health devices`` output is this scenario's.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from kubelet_dra.status.podjson import MutableObj as Obj
from kubelet_dra.testing import FakeApiServer, make_claim, make_pod

DRIVER = "gpu.example.com"
NODE = "demo-node"
XID = "ECC uncorrectable error count exceeded (XID 48)"
T0 = "2026-12-01T09:00:00Z"


def resource(resource_id: str, health: str, message: str = "") -> Obj:
    entry = {"resourceID": resource_id, "health": health}
    if message:
        entry["message"] = message
    return entry


def with_health(
    pod: Obj,
    entries: Sequence[Obj],
    *,
    container: str = "main",
    condition: Obj | None = None,
) -> Obj:
    """``pod`` with ``allocatedResourcesStatus`` on one container and maybe a condition."""
    pod = copy.deepcopy(pod)
    status = pod["status"]
    for cs in status["containerStatuses"]:
        if cs["name"] == container:
            cs["allocatedResourcesStatus"] = list(entries)
    if condition is not None:
        status["conditions"].append(condition)
    return pod


def condition(status: str, reason: str, message: str = "", since: str = T0) -> Obj:
    return {
        "type": "DeviceHealthy",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }


def rid(device: str) -> str:
    return f"{DRIVER}/{NODE}/{device}"


def demo_scenario(api: FakeApiServer) -> None:
    """train-0: gpu-0, gpu-3 (Unknown); train-1: gpu-1 (Unhealthy), gpu-0; train-2: gpu-2, gpu-1."""
    devices = {
        "train-0": ["gpu-0", "gpu-3"],
        "train-1": ["gpu-1", "gpu-0"],
        "train-2": ["gpu-2", "gpu-1"],
    }
    health = {"gpu-1": ("Unhealthy", XID), "gpu-3": ("Unknown", "")}
    for pod_name, mine in devices.items():
        claim = f"{pod_name}-gpus"
        api.create_claim(
            make_claim(claim, results=[(DRIVER, NODE, d, "gpus") for d in mine], node=NODE)
        )
        entries = [resource(rid(d), *health.get(d, ("Healthy", ""))) for d in mine]
        worst = {h for d in mine for h in [health.get(d, ("Healthy", ""))[0]]}
        if "Unhealthy" in worst:
            cond = condition(
                "False",
                "DeviceUnhealthy",
                f"Unhealthy devices: {DRIVER}/{NODE}/gpu-1 (claim {claim}): {XID}",
            )
        elif "Unknown" in worst:
            cond = condition(
                "Unknown",
                "DeviceHealthUnknown",
                f"Health unknown for devices: {DRIVER}/{NODE}/gpu-3 (claim {claim})",
            )
        else:
            cond = condition("True", "AllDevicesHealthy", "All 2 devices are healthy")
        pod = make_pod(pod_name, NODE, claims=[claim])
        api.create_pod(
            with_health(pod, [{"name": f"claim:{claim}", "resources": entries}], condition=cond)
        )

"""The rest of a control plane for the taint proofs: kube-scheduler and kube-controller-manager.

:func:`start_controllers` runs the real ``kube-scheduler`` and ``kube-controller-manager``
1.37.2 (built by ``_build``) against an interop ``KubeApiServer`` with the admin kubeconfig,
leader election off, serving only on 127.0.0.1. The controller manager runs only what the
proofs need: the Job controller, the resource-claim controller (claims from templates) and
the device-taint-eviction controller. :func:`stop_apiserver` and :func:`start_apiserver` stop
the API server process of a ``KubeApiServer`` (etcd keeps running) and start it again with the
same flags on the same port, for the outage proof.

Also builders for what a scheduler needs to place a DRA pod without a kubelet: a Node with
allocatable resources, a DeviceClass, a ResourceSlice offering devices on that node, and
claims and pods using them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from kubelet_dra.status.podjson import MutableObj as Obj

from ._apiserver import KubeApiServer, _Proc, _spawn, _wait_ready, free_port


@dataclasses.dataclass
class Controllers:
    scheduler: _Proc
    manager: _Proc

    def logs(self) -> str:
        procs = (self.scheduler, self.manager)
        return "\n".join(f"--- {p.name} ---\n{p.tail(6000)}" for p in procs)

    def check(self) -> None:
        for proc in (self.scheduler, self.manager):
            if not proc.alive():
                raise AssertionError(f"{proc.name} exited:\n{proc.tail()}")

    def stop(self) -> None:
        for proc in (self.manager, self.scheduler):
            proc.stop()


def start_controllers(
    server: KubeApiServer, *, scheduler_bin: Path, manager_bin: Path, workdir: Path
) -> Controllers:
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = str(server.kubeconfig)
    common = [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        "--v=2",
    ]
    scheduler = _spawn(
        "kube-scheduler",
        [
            str(scheduler_bin),
            *common,
            f"--secure-port={free_port()}",
            f"--cert-dir={workdir / 'scheduler-certs'}",
        ],
        workdir / "kube-scheduler.log",
    )
    manager = _spawn(
        "kube-controller-manager",
        [
            str(manager_bin),
            *common,
            f"--secure-port={free_port()}",
            f"--cert-dir={workdir / 'kcm-certs'}",
            "--controllers=job-controller,resourceclaim-controller,"
            "device-taint-eviction-controller",
            "--use-service-account-credentials=false",
            "--concurrent-job-syncs=2",
        ],
        workdir / "kube-controller-manager.log",
    )
    return Controllers(scheduler, manager)


def stop_apiserver(server: KubeApiServer) -> None:
    """Stop the kube-apiserver process of ``server`` (etcd keeps running)."""
    next(p for p in server._procs if p.name == "kube-apiserver").stop()


def start_apiserver(server: KubeApiServer, timeout: float = 180.0) -> None:
    """Start it again with the same flags, port and log file; wait until ready."""
    procs: list[_Proc] = server._procs
    index = next(i for i, p in enumerate(procs) if p.name == "kube-apiserver")
    old = procs[index]
    args: Sequence[str] = list(old.popen.args)
    procs[index] = _spawn("kube-apiserver", args, old.log)
    _wait_ready(server.url, server.ca_file, server.admin_token, procs, timeout)


# -- objects -------------------------------------------------------------------------------------


def node(name: str) -> Obj:
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"capacity": resources, "allocatable": resources},
    }


def device_class(driver: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": driver},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }


def resource_slice(driver: str, node_name: str, devices: Sequence[str]) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node_name}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": d} for d in devices],
        },
    }


def device_request(driver: str, tolerate: str | None = None) -> Obj:
    exactly: Obj = {"deviceClassName": driver, "allocationMode": "ExactCount", "count": 1}
    if tolerate:
        # The effect must be named: the 1.37 eviction controller honours only tolerations
        # whose effect is NoExecute (one without an effect is not enough for it).
        exactly["tolerations"] = [{"key": tolerate, "operator": "Exists", "effect": "NoExecute"}]
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def claim(name: str, namespace: str, driver: str, tolerate: str | None = None) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": device_request(driver, tolerate),
    }


def pod_spec(claim_ref: Obj, node_name: str | None = None) -> Obj:
    spec: Obj = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "resourceClaims": [{"name": "gpu", **claim_ref}],
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/train:1",
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
    }
    if node_name is not None:
        # Keep the pod on the sidecar's node (the scheduler still allocates the claim).
        spec["nodeSelector"] = {"kubernetes.io/hostname": node_name}
    return spec


def pod(name: str, namespace: str, claim_name: str, node_name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": pod_spec({"resourceClaimName": claim_name}, node_name),
    }


def allocated_device(claim_obj: Obj) -> str | None:
    results = (((claim_obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or []
    return str(results[0]["device"]) if results else None

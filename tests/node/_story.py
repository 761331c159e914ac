"""The device-failure story on the real node: a device that can fail, a Job that uses it.

:class:`StoryDevice` is one device of the scripted Go driver as a real workload sees it. Its
node (``/dev/null``'s numbers) lies in a host directory of its own that the driver's CDI spec
bind-mounts at ``/dev/dra/<device>`` (the control file's ``device_dir``). A device node given
to containerd as a CDI ``deviceNode`` is not the host's: runc makes a copy in the container's
``/dev``, so removing the host's node changes nothing inside. Entries of a bind-mounted
directory are the host's own, so :meth:`StoryDevice.fail` (the node goes, as when a device
drops off its bus and its node is removed) is seen by the container at its next ``open``:
``No such file or directory``. At the same moment the driver streams ``Unhealthy`` with a
message, as a driver's health check does on such a failure.

:class:`Story` holds one test's world on the node tier's kubelet: the device, its driver
(registered with the kubelet), a ResourceSlice offering the device (this driver publishes
none; the scheduler needs one), a ResourceClaimTemplate that selects it, and our sidecar. The
real kube-scheduler allocates the claims and binds the pods, the real resourceclaim and Job
controllers of kube-controller-manager make the claims and pods (tests/interop/_controlplane.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import stat
import time
from collections.abc import Sequence
from pathlib import Path

from kubelet_dra.status.podjson import MutableObj as Obj
from tests.e2e import _api, _dra
from tests.interop._cluster import SidecarProcess
from tests.interop._driver import DriverProcess
from tests.node import _node

DEVICE = "gpu-0"
#: Where the workload finds the device's node: the driver's ``device_dir`` mount.
IN_CONTAINER = f"/dev/dra/{DEVICE}/node"
MESSAGE = "XID 79: GPU has fallen off the bus"
#: The workload's exit code when its device has gone (as a CUDA program's on a lost GPU).
DEVICE_LOST = 42


def workload(iterations: int, code: int = 0) -> str:
    """A shell loop that opens (and reads) the device ``iterations`` times, 0.1 s apart,
    then exits ``code``; it exits :data:`DEVICE_LOST` at the first open that fails. ``cat``,
    not a redirection of ``:``: a shell may exit at once when the redirection of a special
    built-in fails, with a code of its own."""
    return (
        f"n=0; while [ $n -lt {iterations} ]; do "
        f"if ! cat {IN_CONTAINER}; then echo 'device lost'; exit {DEVICE_LOST}; fi; "
        f"n=$((n+1)); [ $n -eq 1 ] && echo opened; sleep 0.1; done; echo done; exit {code}"
    )


class StoryDevice:
    """A device node in a directory of its own; see the module docstring."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir / f"{DEVICE}.d"
        self.dir.mkdir(parents=True)
        self.node = self.dir / "node"
        self.restore()

    def restore(self) -> None:
        if not self.node.exists():
            os.mknod(self.node, 0o666 | stat.S_IFCHR, os.stat("/dev/null").st_rdev)

    def fail(self) -> None:
        self.node.unlink()


@dataclasses.dataclass
class Story:
    """One test's world; see the module docstring."""

    api: _api.Api
    kubelet: _node.NodeKubelet
    namespace: str
    pool: str
    device: StoryDevice
    driver: DriverProcess
    workdir: Path
    sidecar: SidecarProcess | None = None

    def script(self, health: str = "HEALTHY", message: str = "") -> Obj:
        entry: Obj = {"pool": self.pool, "device": DEVICE, "health": health}
        if message:
            entry["message"] = message
        prepare = {"pool": self.pool, "device": DEVICE, "device_dir": str(self.device.dir)}
        return {"devices": [entry], "prepare_devices": [prepare], "resend_seconds": 5.0}

    def fail_device(self) -> float:
        """The driver reports the device Unhealthy and its node goes; returns when (Unix)."""
        self.driver.control(self.script("UNHEALTHY", MESSAGE))
        at = time.time()
        self.device.fail()
        return at

    def restore_device(self) -> None:
        self.device.restore()
        self.driver.control(self.script("HEALTHY"))

    def publish(self) -> None:
        """The ResourceSlice and the ResourceClaimTemplate ``gpu`` that selects its device."""
        self.api.create("/apis/resource.k8s.io/v1/resourceslices", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": self.pool},
            "spec": {"driver": _dra.DRIVER, "nodeName": self.kubelet.node,
                     "pool": {"name": self.pool, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": DEVICE,
                                  "attributes": {"story": {"string": self.namespace}}}]},
        })  # fmt: skip
        selector = f'device.attributes["{_dra.DRIVER}"].story == "{self.namespace}"'
        templates = f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}/resourceclaimtemplates"
        self.api.create(templates, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "gpu"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": _dra.DRIVER, "selectors": [{"cel": {"expression": selector}}],
            }}]}}},
        })  # fmt: skip

    def pod_spec(self, script: str, restart: str = "Never") -> Obj:
        return {
            "restartPolicy": restart, "hostNetwork": True,
            "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
            "containers": [{
                "name": _dra.CONTAINER, "image": self.kubelet.containerd.images[1].name,
                "imagePullPolicy": "Never", "command": ["sh", "-c", script],
                "resources": {"claims": [{"name": "gpu"}]},
            }],
        }  # fmt: skip

    def create_job(self, name: str, script: str) -> Obj:
        """A Job with docs/remediation.md's podFailurePolicy and ``backoffLimit: 0``: one
        counted failure fails it."""
        return self.api.create(f"/apis/batch/v1/namespaces/{self.namespace}/jobs", {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {
                "backoffLimit": 0,
                "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [
                    {"type": "DeviceHealthy", "status": "False"}]}]},
                "template": {"spec": self.pod_spec(script)},
            },
        })  # fmt: skip

    def create_pod(self, name: str, script: str, restart: str) -> Obj:
        return self.api.create(f"/api/v1/namespaces/{self.namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": self.pod_spec(script, restart),
        })  # fmt: skip

    def job(self, name: str) -> Obj:
        return self.api.get(f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{name}")

    def job_pods(self, name: str) -> list[Obj]:
        pods = self.api.get(
            f"/api/v1/namespaces/{self.namespace}/pods?labelSelector=job-name%3D{name}"
        )
        items: list[Obj] = pods.get("items") or []
        return sorted(items, key=lambda p: str(p["metadata"]["creationTimestamp"]))

    def log(self, pod: Obj) -> str:
        """The container's output, as containerd wrote it to the kubelet's log files."""
        meta = pod["metadata"]
        base = self.kubelet.workdir / "pod-logs"
        found = sorted(base.glob(f"{meta['namespace']}_{meta['name']}_{meta['uid']}/*/*.log"))
        return "".join(path.read_text(errors="replace") for path in found)

    def pods(self) -> list[Obj]:
        items: list[Obj] = self.api.get(f"/api/v1/namespaces/{self.namespace}/pods")["items"]
        return items

    def delete_pods(self, timeout: float = 90.0) -> None:
        """Delete the Jobs and pods (no garbage collector runs here) while the driver still
        runs, so that the kubelet unprepares their claims; wait until the pods are gone."""
        jobs = self.api.get(f"/apis/batch/v1/namespaces/{self.namespace}/jobs")["items"]
        for job in jobs:
            self.api.delete(f"/apis/batch/v1/namespaces/{self.namespace}/jobs/"
                            f"{job['metadata']['name']}")  # fmt: skip
        for pod in self.pods():
            self.api.call("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/"
                          f"{pod['metadata']['name']}?gracePeriodSeconds=0")  # fmt: skip
        _dra.wait(lambda: not self.pods(), timeout, "the story's pods to go", interval=0.5)

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            self.delete_pods()
        if self.sidecar is not None:
            self.sidecar.stop()
        self.driver.stop()
        for path in (f"/api/v1/namespaces/{self.namespace}",
                     f"/apis/resource.k8s.io/v1/resourceslices/{self.pool}"):  # fmt: skip
            with contextlib.suppress(_api.ApiError):
                self.api.delete(path)
        shutil.rmtree(self.workdir, ignore_errors=True)


def condition_of(pod: Obj) -> Obj:
    return _dra.condition(pod) or {}


def terminated(pod: Obj, last: bool = False) -> Obj | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        state = (status.get("lastState" if last else "state") or {}).get("terminated")
        if state:
            found: Obj = state
            return found
    return None


def restart_count(pod: Obj) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return int(statuses[0].get("restartCount", 0))


def job_condition(job: Obj, kind: str) -> Obj | None:
    for cond in (job.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind and cond.get("status") == "True":
            found: Obj = cond
            return found
    return None


def leftovers(world: Story, uid: str, ids: Sequence[str] = ()) -> dict[str, list[str]]:
    """What the node still holds of the pod ``uid``: containerd's containers and sandbox
    (the kubelet labels each with the pod's UID), mounts in the node's mount namespace that
    name the pod or one of ``ids`` (its containers' and sandbox's rootfs and shm), CDI
    specs, the kubelet's pod directory."""
    containerd = world.kubelet.containerd
    label = f'labels."io.kubernetes.pod.uid"=={uid}'
    containers = containerd.ctr("containers", "list", "--quiet", label).stdout.split()
    mountinfo = Path(f"/proc/{world.kubelet.namespace.pid}/mountinfo").read_text()
    names = (uid, str(world.device.dir), *ids)
    mounts = [line.split()[4] for line in mountinfo.splitlines()
              if any(name in line for name in names)]  # fmt: skip
    specs = [p.name for p in world.kubelet.cdi_dir.iterdir()]
    pod_dir = world.kubelet.root / "pods" / uid
    return {"containers": containers, "mounts": mounts, "cdi specs": specs,
            "pod dir": [str(pod_dir)] if pod_dir.exists() else []}  # fmt: skip

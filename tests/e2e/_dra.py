"""A DRA workload on the e2e node: the driver, a claim allocated to it, a pod that uses it.

There is no scheduler in this tier, so :func:`create_pod` does its part: it creates the pod
unbound, writes the claim's allocation and ``reservedFor`` (as the scheduler would), then
binds the pod, so the kubelet sees the pod only once its claim is reserved for it.

The driver is the interop suite's Go driver on the upstream ``kubeletplugin`` helper; its
control file (``tests/interop/driver/common/control.go``) scripts both what it streams as
health and what ``NodePrepareResources`` returns (the CDI device IDs the kubelet then uses as
``resourceID``). :class:`Devices` keeps the two together so that a health flip never loses
the prepare answer.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from kubelet_dra.status.podjson import MutableObj as Obj
from tests.e2e._api import Api
from tests.interop._driver import DriverProcess

DRIVER = "gpu.e2e.kubelet-dra.test"
CONTAINER = "main"


@dataclasses.dataclass
class Device:
    """One scripted device: its health and the CDI device IDs its prepare answer gives."""

    name: str
    health: str = "HEALTHY"
    message: str = ""
    cdi_ids: tuple[str, ...] = ()

    def cdi(self, driver: str) -> tuple[str, ...]:
        return self.cdi_ids or (f"{driver}/gpu={self.name}",)


@dataclasses.dataclass
class Devices:
    """The driver's script: devices of one pool (the node's), re-sent every few seconds."""

    pool: str
    devices: list[Device]
    resend_seconds: float = 5.0

    def script(self, driver: str) -> Obj:
        return {
            "devices": [
                {"pool": self.pool, "device": d.name, "health": d.health,
                 **({"message": d.message} if d.message else {})}
                for d in self.devices
            ],
            "prepare_devices": [
                {"pool": self.pool, "device": d.name, "cdi_device_ids": list(d.cdi(driver))}
                for d in self.devices
            ],
            "resend_seconds": self.resend_seconds,
        }  # fmt: skip

    def set(self, name: str, health: str, message: str = "") -> None:
        for device in self.devices:
            if device.name == name:
                device.health, device.message = health, message
                return
        raise KeyError(name)


def apply(driver: DriverProcess, devices: Devices) -> None:
    driver.control(devices.script(driver.driver_name))


def ensure_namespace(api: Api, namespace: str) -> None:
    if api.maybe(f"/api/v1/namespaces/{namespace}") is None:
        api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": namespace}})  # fmt: skip


def ensure_device_class(api: Api, driver: str) -> None:
    if api.maybe(f"/apis/resource.k8s.io/v1/deviceclasses/{driver}") is None:
        api.create("/apis/resource.k8s.io/v1/deviceclasses", {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        })  # fmt: skip


def pod_object(name: str, claim: str, *, restart: str = "Never", template: bool = False) -> Obj:
    ref = {"resourceClaimTemplateName": claim} if template else {"resourceClaimName": claim}
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "restartPolicy": restart, "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", **ref}],
            "containers": [{"name": CONTAINER, "image": "registry.invalid/e2e:1",
                            "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }  # fmt: skip


def create_pod(
    api: Api,
    *,
    namespace: str,
    name: str,
    node: str,
    driver: str,
    devices: Sequence[str],
    restart: str = "Never",
    template: bool = False,
    spec: Obj | None = None,
) -> Obj:
    """Create a claim for ``devices`` and a pod using it, allocated and bound to ``node``.

    ``spec``: fields that replace those of :func:`pod_object`'s pod spec (the node tier's
    image, command and host network).

    ``template``: the pod names a ResourceClaimTemplate and this plays the resourceclaim
    controller (there is no controller manager here): the claim is generated for the pod,
    owned by it, and named in ``status.resourceClaimStatuses``. A kubelet before 1.36 finds
    a claim's name only there, so it writes no health for a directly named claim (the
    conformance matrix's ``claim-name-fallback``).
    """
    base = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    claim_name = f"{name}-gpu"
    obj = pod_object(name, f"{claim_name}-template" if template else claim_name,
                     restart=restart, template=template)  # fmt: skip
    obj["spec"].update(spec or {})
    pod = api.create(f"/api/v1/namespaces/{namespace}/pods", obj)
    meta: Obj = {"name": claim_name}
    if template:
        meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
        meta["ownerReferences"] = [{
            "apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}]  # fmt: skip
    claim = api.create(base, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": driver, "allocationMode": "ExactCount",
            "count": len(devices)}}]}},
    })  # fmt: skip
    if template:
        statuses = [{"name": "gpu", "resourceClaimName": claim_name}]
        api.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                  {"status": {"resourceClaimStatuses": statuses}})  # fmt: skip
    claim["status"] = {
        "allocation": {
            "devices": {"results": [
                {"request": "gpu", "driver": driver, "pool": node, "device": d} for d in devices
            ]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        },
        "reservedFor": [{"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}],
    }  # fmt: skip
    api.put(f"{base}/{claim_name}/status", claim)
    api.create(f"/api/v1/namespaces/{namespace}/pods/{name}/binding", {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    })  # fmt: skip
    return pod


def get_pod(api: Api, namespace: str, name: str) -> Obj:
    return api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def field(pod: Obj, container: str = CONTAINER) -> list[Obj] | None:
    """The container's ``allocatedResourcesStatus`` (None when absent)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or ():
        if cs.get("name") == container:
            entries = cs.get("allocatedResourcesStatus")
            return list(entries) if entries is not None else None
    return None


def field_health(pod: Obj) -> dict[str, str]:
    """resourceID -> health, over every entry of the container's field."""
    return {
        str(r.get("resourceID")): str(r.get("health"))
        for entry in field(pod) or ()
        for r in entry.get("resources") or ()
    }


def condition(pod: Obj, kind: str = "DeviceHealthy") -> Obj | None:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            found: Obj = cond
            return found
    return None


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", ""))


def wait(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll until ``predicate()`` is truthy; its last error or value goes into the failure."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


class PodHistory:
    """Every version of one pod, from a watch held open by a thread (restarted on EOF).

    The tests check what a pod ever showed (an ``Unknown`` blip, a removed field) from this
    history, not from what they happened to poll.
    """

    def __init__(self, api: Api, namespace: str, name: str) -> None:
        import threading

        self.api, self.namespace, self.name = api, namespace, name
        self.versions: list[tuple[float, Obj]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import json
        import urllib.request

        path = (f"/api/v1/namespaces/{self.namespace}/pods?watch=1"
                f"&fieldSelector=metadata.name%3D{self.name}&timeoutSeconds=30")  # fmt: skip
        while not self._stop.is_set():
            # Resume from the last version seen, so a reopened watch misses none.
            since = self.versions[-1][1]["metadata"]["resourceVersion"] if self.versions else ""
            request = urllib.request.Request(
                self.api.url + path + (f"&resourceVersion={since}" if since else "")
            )
            request.add_header("Authorization", f"Bearer {self.api.token}")
            try:
                with urllib.request.urlopen(request, context=self.api._tls, timeout=60) as stream:
                    for raw in stream:
                        event = json.loads(raw)
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self.versions.append((time.time(), event["object"]))
                        if self._stop.is_set():
                            return
            except Exception:
                time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()

    def healths(self) -> list[dict[str, str]]:
        """The field's resourceID -> health in each version, in order."""
        return [field_health(pod) for _, pod in self.versions]

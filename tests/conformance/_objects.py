"""The API objects a scenario turns into: ResourceClaims, Pods and prepare answers.

Both sides get exactly these objects: the twin receives the claims (its fake
clientset) and the pods (``prepare``, ``sync``); our side receives the same
pods (``DRAHealthManager.set_pod``) and the devices the same driver returned
from the same ``NodePrepareResources`` call shape. UIDs are derived from the
scenario and object names, so a rerun gives the same objects.

The shapes are those ``pkg/kubelet/cm/dra/manager.go`` reads in
``prepareResources`` (``resourceclaim.Name``, ``IsForPod``,
``IsReservedForPod``) and ``UpdateAllocatedResourcesStatus``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from tests.conformance import _scenario as sc

_NS = uuid.UUID("6f1c0e1e-6a52-4d43-9f57-2a9c5d1f0c11")


def uid(scenario: sc.Scenario, kind: str, name: str) -> str:
    return str(uuid.uuid5(_NS, f"{scenario.name}/{kind}/{name}"))


def claim_object(scenario: sc.Scenario, claim: sc.Claim) -> dict[str, Any]:
    """The ``resource.k8s.io/v1`` ResourceClaim, allocated and reserved for its pods."""
    users = [p for p in scenario.pods if any(r.claim == claim.name for r in p.claims)]
    meta: dict[str, Any] = {
        "name": claim.name,
        "namespace": claim.namespace,
        "uid": uid(scenario, "claim", claim.name),
    }
    if claim.template is not None and users:
        owner = users[0]
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": owner.name,
                "uid": uid(scenario, "pod", owner.name),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": _ref_of(owner, claim)}
    # A result names a request, or a subrequest ``req/sub`` of a request that lists its
    # subrequests under firstAvailable (what a kube-apiserver validates).
    subs: dict[str, set[str]] = {}
    for d in claim.devices:
        parent, _, sub = (d.request or "req").partition("/")
        subs.setdefault(parent, set()).update([sub] if sub else [])
    results = [
        {
            "request": d.request or "req",
            "driver": d.driver,
            "pool": d.pool,
            "device": d.device,
            **({"shareID": d.share_id} if d.share_id else {}),
        }
        for d in claim.devices
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {
            "devices": {"requests": [_request(name, sorted(subs[name])) for name in sorted(subs)]}
        },
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [
                {"resource": "pods", "name": p.name, "uid": uid(scenario, "pod", p.name)}
                for p in users
            ],
        },
    }


def _request(name: str, subrequests: list[str]) -> dict[str, Any]:
    device_class = {"deviceClassName": "conformance.example.com"}
    if not subrequests:
        return {"name": name, "exactly": device_class}
    return {"name": name, "firstAvailable": [{"name": s, **device_class} for s in subrequests]}


def _ref_of(pod: sc.Pod, claim: sc.Claim) -> str:
    return next(r.name for r in pod.claims if r.claim == claim.name)


def pod_object(scenario: sc.Scenario, pod: sc.Pod) -> dict[str, Any]:
    """The ``v1`` Pod with one container status (name only) per container."""
    refs = []
    statuses = []
    for ref in pod.claims:
        if ref.template is not None:
            refs.append({"name": ref.name, "resourceClaimTemplateName": ref.template})
            if ref.status_name:
                statuses.append({"name": ref.name, "resourceClaimName": ref.claim})
        else:
            refs.append({"name": ref.name, "resourceClaimName": ref.claim})
    spec: dict[str, Any] = {
        "nodeName": scenario.node,
        "resourceClaims": refs,
        "containers": [_container(c) for c in pod.containers],
    }
    if pod.init_containers:
        spec["initContainers"] = [_container(c) for c in pod.init_containers]
    status: dict[str, Any] = {
        "phase": "Running",
        "containerStatuses": [{"name": c.name} for c in pod.containers],
    }
    if pod.init_containers:
        status["initContainerStatuses"] = [{"name": c.name} for c in pod.init_containers]
    if statuses:
        status["resourceClaimStatuses"] = statuses
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": pod.namespace,
            "uid": uid(scenario, "pod", pod.name),
        },
        "spec": spec,
        "status": status,
    }


def _container(container: sc.Container) -> dict[str, Any]:
    claims = []
    for ref, request in container.claim_refs():
        entry = {"name": ref}
        if request:
            entry["request"] = request
        claims.append(entry)
    out: dict[str, Any] = {"name": container.name, "image": "registry.k8s.io/pause:3.10"}
    if claims:
        out["resources"] = {"claims": claims}
    if container.restartable:
        out["restartPolicy"] = "Always"
    return out


def prepare_answers(
    scenario: sc.Scenario, driver: str, uids: Mapping[str, str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Claim UID -> the devices ``driver``'s NodePrepareResources returns for it.

    ``uids``: claim name -> UID, where the claims got theirs from a kube-apiserver.
    """
    answers: dict[str, list[dict[str, Any]]] = {}
    for claim in scenario.claims:
        devices = [d.answer() for d in claim.devices if d.driver == driver and d.returned]
        if any(d.driver == driver for d in claim.devices):
            key = (uids or {}).get(claim.name) or uid(scenario, "claim", claim.name)
            answers[key] = devices
    return answers


def with_uids(obj: Any, uids: Mapping[str, str]) -> Any:
    """``obj`` with every ``uid`` field that names a key of ``uids`` renamed (a pod's own,
    and the pods a claim is reserved for or owned by), for pods an API server created."""
    if isinstance(obj, dict):
        return {
            k: uids.get(v, v) if k == "uid" and isinstance(v, str) else with_uids(v, uids)
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [with_uids(v, uids) for v in obj]
    return obj


def pod_uid_names(scenario: sc.Scenario) -> dict[str, str]:
    """Pod UID -> name, to print readable diffs."""
    return {uid(scenario, "pod", p.name): p.name for p in scenario.pods}

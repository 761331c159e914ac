"""Builders of realistic Pod and ResourceClaim objects (plain dicts) for tests.

The shapes follow what a real cluster holds once the scheduler allocated a claim and the kubelet
started the pod: ``spec.resourceClaims`` and per-container ``resources.claims`` (with an optional
request), ``status.resourceClaimStatuses`` for template-generated claims only (as the
resourceclaim controller writes them), container statuses as the kubelet writes them, and
resource.k8s.io/v1 claims with ``status.allocation.devices.results`` and ``status.reservedFor``.
Every object deserializes into the official client's models.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubelet_dra.testing.fakeapi import _store as storage

Obj = dict[str, Any]
IMAGE = "registry.k8s.io/pause:3.10"


@dataclass(frozen=True)
class PodClaim:
    """An entry of ``pod.spec.resourceClaims``.

    ``claim_name`` is the ResourceClaim object's name (default: ``name``). With ``template``
    set the claim was generated from that ResourceClaimTemplate and ``claim_name`` is the
    generated name recorded in ``status.resourceClaimStatuses``.
    """

    name: str
    claim_name: str | None = None
    template: str | None = None

    @property
    def object_name(self) -> str:
        return self.claim_name or self.name


@dataclass(frozen=True)
class Container:
    """A container; ``claims`` are pod claim names or ``(name, request)`` pairs."""

    name: str
    claims: Sequence[str | tuple[str, str]] = ()
    requests: Mapping[str, str] = field(default_factory=dict)


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def container_status(name: str, *, restart_count: int = 0, ready: bool = True) -> Obj:
    """A running container's status as the kubelet reports it."""
    return {
        "name": name,
        "image": IMAGE,
        "imageID": f"registry.k8s.io/pause@sha256:{_digest('image')}",
        "containerID": f"containerd://{_digest(name, str(restart_count))}",
        "ready": ready,
        "started": True,
        "restartCount": restart_count,
        "state": {"running": {"startedAt": storage.now_rfc3339()}},
    }


def fresh_container_statuses(pod: Obj) -> list[Obj]:
    """What a kubelet without device health computes: the spec's containers, no health."""
    old = {cs.get("name"): cs for cs in (pod.get("status") or {}).get("containerStatuses") or []}
    statuses = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        cs = dict(old.get(c["name"]) or container_status(c["name"]))
        cs.pop("allocatedResourcesStatus", None)
        statuses.append(cs)
    return statuses


def _pod_claim_spec(claim: PodClaim) -> Obj:
    if claim.template:
        return {"name": claim.name, "resourceClaimTemplateName": claim.template}
    return {"name": claim.name, "resourceClaimName": claim.object_name}


def _container_spec(container: Container) -> Obj:
    claims = [
        {"name": c} if isinstance(c, str) else {"name": c[0], "request": c[1]}
        for c in container.claims
    ]
    resources: Obj = {}
    if claims:
        resources["claims"] = claims
    if container.requests:
        resources["requests"] = dict(container.requests)
    return {
        "name": container.name,
        "image": IMAGE,
        "resources": resources,
        "imagePullPolicy": "IfNotPresent",
    }


def make_pod(
    name: str,
    node: str = "node-1",
    *,
    namespace: str = "default",
    claims: Sequence[str | PodClaim] = (),
    containers: Sequence[str | Container] | None = None,
    labels: Mapping[str, str] | None = None,
    phase: str = "Running",
) -> Obj:
    """A running pod on ``node``; by default one container ``main`` using every claim."""
    pod_claims = [PodClaim(c) if isinstance(c, str) else c for c in claims]
    if containers is None:
        containers = [Container("main", claims=[c.name for c in pod_claims])]
    specs = [Container(c) if isinstance(c, str) else c for c in containers]
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "containers": [_container_spec(c) for c in specs],
            "resourceClaims": [_pod_claim_spec(c) for c in pod_claims],
        },
    }
    pod["status"] = _running_status(pod, pod_claims, phase)
    return pod


def _running_status(pod: Obj, claims: Sequence[PodClaim], phase: str) -> Obj:
    now = storage.now_rfc3339()
    conditions = [
        {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
        for t in (
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled",
        )
    ]
    pod_status: Obj = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": "10.0.0.10",
        "podIP": "10.244.0.10",
        "startTime": now,
        "qosClass": "BestEffort",
        "containerStatuses": fresh_container_statuses(pod),
    }
    generated = [{"name": c.name, "resourceClaimName": c.object_name} for c in claims if c.template]
    if generated:
        pod_status["resourceClaimStatuses"] = generated
    return pod_status


def make_claim(
    name: str,
    namespace: str = "default",
    results: Sequence[tuple[str, str, str, str]] = (),
    *,
    reserved_for: Sequence[Obj] = (),
    node: str | None = "node-1",
) -> Obj:
    """An allocated resource.k8s.io/v1 claim; ``results`` are (driver, pool, device, request).

    ``reserved_for`` takes pod objects (as returned by the server, so they carry a uid).
    """
    requests = sorted({r[3].split("/")[0] for r in results})
    drivers = {r[3].split("/")[0]: r[0] for r in results}
    allocation: Obj = {
        "devices": {
            "results": [
                {"driver": d, "pool": p, "device": dev, "request": req}
                for d, p, dev, req in results
            ]
        }
    }
    if node is not None:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        allocation["nodeSelector"] = {"nodeSelectorTerms": [term]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": r,
                        "exactly": {
                            "deviceClassName": f"{drivers[r]}-class",
                            "allocationMode": "ExactCount",
                            "count": 1,
                        },
                    }
                    for r in requests
                ]
            }
        },
        "status": {
            "allocation": allocation,
            "reservedFor": [
                {
                    "resource": "pods",
                    "name": p["metadata"]["name"],
                    "uid": p["metadata"].get("uid", ""),
                }
                for p in reserved_for
            ],
        },
    }

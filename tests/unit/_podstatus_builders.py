"""Plain-dict pods and claims shared by the claim index and pod status tests (no tests here)."""

from __future__ import annotations

from typing import Any

from kubelet_dra import models
from kubelet_dra.testing import make_claim

NOW = 1_700_000_000.0


def pod(
    *,
    uid: str = "pod-uid",
    name: str = "pod",
    namespace: str = "default",
    node: str = "node-a",
    claims: list[dict[str, Any]] | None = None,
    statuses: list[dict[str, Any]] | None = None,
    containers: list[dict[str, Any]] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    container_statuses: list[dict[str, Any]] | None = None,
    init_container_statuses: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node, "containers": containers or []}
    if claims is not None:
        spec["resourceClaims"] = claims
    if init_containers is not None:
        spec["initContainers"] = init_containers
    status: dict[str, Any] = {}
    if statuses is not None:
        status["resourceClaimStatuses"] = statuses
    if container_statuses is not None:
        status["containerStatuses"] = container_statuses
    if init_container_statuses is not None:
        status["initContainerStatuses"] = init_container_statuses
    return {
        "metadata": {"uid": uid, "name": name, "namespace": namespace},
        "spec": spec,
        "status": status,
    }


def container(name: str, *claims: tuple[str, str], restart: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name,
        "resources": {"claims": [{"name": n, **({"request": r} if r else {})} for n, r in claims]},
    }
    if restart:
        out["restartPolicy"] = restart
    return out


def claim(
    name: str,
    *results: tuple[str, str, str, str],
    namespace: str = "default",
    uid: str = "claim-uid",
    owner: str | None = None,
) -> dict[str, Any]:
    """The public builder's claim with a uid and owner; each result is (request, driver, pool,
    device). Without results the claim is not allocated (no status)."""
    out = make_claim(name, namespace, [(d, p, x, r) for r, d, p, x in results], node=None)
    out["metadata"]["uid"] = uid
    if owner:
        out["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner, "controller": True}
        ]
    if not results:
        out["status"] = {}
    return out


def healthy(message: str = "") -> models.DeviceHealth:
    return models.DeviceHealth(models.HealthStatus.HEALTHY, message, 30.0, NOW)


def record(health: models.HealthStatus, message: str = "") -> models.DeviceHealth:
    return models.DeviceHealth(health, message, 30.0, NOW)


def health_map(
    table: dict[models.DeviceKey, models.DeviceHealth],
) -> Any:
    return lambda key: table.get(key, models.UNKNOWN_DEVICE)

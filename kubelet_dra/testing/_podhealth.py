"""``pod_device_health``: a pod's device health as a test reads it, from its status.

The reading side of what the kubelet writes in ``pkg/kubelet/cm/dra/manager.go``
(``UpdateAllocatedResourcesStatus``: one ``allocatedResourcesStatus`` entry
``claim:<claim>[/<request>]`` per claim a container uses) plus the pod condition we add
(``DeviceHealthy`` by default). Device-plugin entries (not ``claim:``) are left out: they
are not DRA health.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from kubelet_dra.status import podjson, podstatus

__all__ = ["DeviceHealthEntry", "PodDeviceHealth", "pod_device_health"]

_FIELDS = ("initContainerStatuses", "containerStatuses")
_CLAIM_PREFIX = "claim:"


class DeviceHealthEntry(NamedTuple):
    """One resource of one ``allocatedResourcesStatus`` entry of one container."""

    container: str
    claim: str  # the entry's name without ``claim:``: ``<claim>`` or ``<claim>/<request>``
    resource_id: str
    health: str  # "Healthy", "Unhealthy" or "Unknown" (what the API holds, unchecked)
    message: str = ""


class PodDeviceHealth(NamedTuple):
    """Every DRA device health entry of a pod and its device condition (``None``: absent)."""

    entries: tuple[DeviceHealthEntry, ...]
    condition: Mapping[str, Any] | None

    @property
    def by_resource(self) -> dict[str, str]:
        """``resourceID -> health``; a device seen by several containers is listed once."""
        return {e.resource_id: e.health for e in self.entries}

    def of(self, resource_id: str) -> str | None:
        """The health written for ``resource_id`` (``None``: no entry names it)."""
        return self.by_resource.get(resource_id)

    @property
    def condition_status(self) -> str | None:
        """``"True"``, ``"False"``, ``"Unknown"``, or ``None`` without the condition."""
        return None if self.condition is None else str(self.condition.get("status", ""))


def pod_device_health(
    pod: Mapping[str, Any] | object, *, condition_type: str = "DeviceHealthy"
) -> PodDeviceHealth:
    """Read ``pod`` (a dict as the API returns it, or the official client's ``V1Pod``).

    ``condition_type`` is the manager's ``Settings.pod_condition_type``.

    A test asserts on the result instead of walking the status by hand::

        health = pod_device_health(api.get_pod("default", "train"))
        assert health.of("gpu.example.com/node-1/gpu-0") == "Unhealthy"
        assert health.condition_status == "False"
    """
    obj = pod if isinstance(pod, Mapping) else _to_json(pod)
    status = podjson.status(obj)
    entries = [
        DeviceHealthEntry(
            container=str(container.get("name") or ""),
            claim=str(entry.get("name") or "").removeprefix(_CLAIM_PREFIX),
            resource_id=str(resource.get("resourceID") or ""),
            health=str(resource.get("health") or ""),
            message=str(resource.get("message") or ""),
        )
        for field in _FIELDS
        for container in podjson.items(status, field)
        for entry in container.get("allocatedResourcesStatus") or ()
        if str(entry.get("name") or "").startswith(_CLAIM_PREFIX)
        for resource in entry.get("resources") or ()
    ]
    return PodDeviceHealth(tuple(entries), podstatus.find_condition(status, condition_type))


def _to_json(model: object) -> Mapping[str, Any]:
    """A client model as the JSON the API sent (camelCase keys), as the client serializes it."""
    import kubernetes.client  # only for client models: a dict needs no client

    client: Any = kubernetes.client.ApiClient()  # untyped: no stubs for the client
    value = client.sanitize_for_serialization(model)
    if not isinstance(value, Mapping):
        raise TypeError(f"not a pod: {type(model).__name__}")
    return value

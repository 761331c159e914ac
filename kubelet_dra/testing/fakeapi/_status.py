"""Error Status objects and pod-status write rules of the fake API server.

Mimics the kube-apiserver's ``apimachinery/pkg/api/errors`` constructors (the JSON ``Status``
bodies clients parse), the pod status strategy's feature-gate field drops
(``pkg/api/pod/util.go``) and ``validateContainerStatusAllocatedResourcesStatus`` from
``pkg/apis/core/validation/validation.go`` (KEP-4680).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

HEALTH_VALUES = ("Healthy", "Unhealthy", "Unknown")
MESSAGE_MAX_BYTES = 1024  # core/v1 ResourceHealthMessageMaxLength
# Lists of container statuses whose allocatedResourcesStatus the apiserver validates, with the
# spec list that names their containers.
_STATUS_LISTS = (("containerStatuses", "containers"), ("initContainerStatuses", "initContainers"))
_ALL_STATUS_LISTS = ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")


class ApiError(Exception):
    """An error answered as a ``Status`` object; raised anywhere below the HTTP handler."""

    def __init__(self, status: dict[str, Any], *, headers: dict[str, str] | None = None) -> None:
        super().__init__(status.get("message", ""))
        self.status = status
        self.code = int(status["code"])
        self.headers = headers or {}


def status_body(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A failure ``Status`` exactly shaped like the apiserver's (``metav1.Status``)."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(
        status_body(
            404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource}
        )
    )


def already_exists(resource: str, name: str) -> ApiError:
    return ApiError(
        status_body(
            409,
            "AlreadyExists",
            f'{resource} "{name}" already exists',
            {"name": name, "kind": resource},
        )
    )


def conflict(resource: str, name: str, why: str | None = None) -> ApiError:
    why = why or (
        "the object has been modified; please apply your changes to the latest version and "
        "try again"
    )
    message = f'Operation cannot be fulfilled on {resource} "{name}": {why}'
    return ApiError(status_body(409, "Conflict", message, {"name": name, "kind": resource}))


def uid_conflict(resource: str, key: str, name: str, wanted: str, actual: str) -> ApiError:
    # The storage layer's precondition failure, interpreted as a conflict (kubelet logs show it).
    why = (
        f"StorageError: invalid object, Code: 4, Key: {key}, ResourceVersion: 0, "
        f"AdditionalErrorMsg: Precondition failed: UID in precondition: {wanted}, "
        f"UID in object meta: {actual}"
    )
    return conflict(resource, name, why)


def bad_request(message: str) -> ApiError:
    return ApiError(status_body(400, "BadRequest", message))


def unprocessable_patch(cause: str) -> ApiError:
    # NewGenericServerResponse(422, ...) as used by the patch handler when a JSON patch fails.
    # kube-apiserver 1.37 sends empty details: the cause (``cause``) is not in the answer.
    del cause
    return ApiError(
        status_body(
            422,
            "Invalid",
            "the server rejected our request due to an error in our request",
            {},
        )
    )


@dataclass(frozen=True)
class FieldError:
    """One ``field.Error``; ``body`` is its ErrorBody(), ``reason`` its cause type."""

    field: str
    reason: str
    body: str

    def __str__(self) -> str:
        return f"{self.field}: {self.body}"


def invalid(kind: str, name: str, errors: list[FieldError]) -> ApiError:
    """``errors.NewInvalid``: 422 with one cause per field error."""
    listed = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
    causes = [{"reason": e.reason, "message": e.body, "field": e.field} for e in errors]
    details = {"name": name, "kind": kind, "causes": causes}
    return ApiError(status_body(422, "Invalid", f'{kind} "{name}" is invalid: {listed}', details))


def _quote(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value)


def _invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError(field, "FieldValueInvalid", f"Invalid value: {_quote(value)}: {detail}")


# --- feature gates -----------------------------------------------------------------------------


def drop_gated_fields(status: dict[str, Any], *, health_gate: bool, message_gate: bool) -> None:
    """Drop fields of disabled gates, as the pod status strategy does before validation."""
    for list_name in _ALL_STATUS_LISTS:
        for cs in status.get(list_name) or []:
            if not isinstance(cs, dict):
                continue
            if not health_gate:
                cs.pop("allocatedResourcesStatus", None)
            elif not message_gate:
                for rs in cs.get("allocatedResourcesStatus") or []:
                    for health in rs.get("resources") or []:
                        health.pop("message", None)


# --- validation --------------------------------------------------------------------------------


def validate_pod_status(pod: dict[str, Any]) -> list[FieldError]:
    """Field errors of the allocatedResourcesStatus rules over regular and init containers."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    errors: list[FieldError] = []
    for list_name, spec_key in _STATUS_LISTS:
        containers = {c.get("name"): c for c in spec.get(spec_key) or []}
        for i, cs in enumerate(status.get(list_name) or []):
            container = containers.get(cs.get("name"))
            for j, rs in enumerate(cs.get("allocatedResourcesStatus") or []):
                path = f"status.{list_name}[{i}].allocatedResourcesStatus[{j}]"
                errors += _validate_resource_status(rs, path, container)
    return errors


def _validate_resource_status(
    rs: dict[str, Any], path: str, container: dict[str, Any] | None
) -> list[FieldError]:
    errors: list[FieldError] = []
    # A status for a container missing from the spec skips the name check (issue #124915).
    if container is not None:
        errors += _validate_name(str(rs.get("name", "")), f"{path}.name", container)
    seen: set[Any] = set()
    for k, health in enumerate(rs.get("resources") or []):
        errors += _validate_health(health, f"{path}.resources[{k}]", seen)
    return errors


def _validate_name(name: str, field: str, container: dict[str, Any]) -> list[FieldError]:
    resources = container.get("resources") or {}
    if name.startswith("claim:"):
        allowed = {
            f"claim:{c.get('name')}" + (f"/{c['request']}" if c.get("request") else "")
            for c in resources.get("claims") or []
        }
        if name not in allowed:
            detail = (
                "must match one of the container's resource claims as "
                "'claim:<claimName>/<requestName>' when container.resources.claims[*].request "
                "is set or 'claim:<claimName>' when it is empty"
            )
            return [_invalid(field, name, detail)]
        return []
    if name not in (resources.get("requests") or {}):
        return [_invalid(field, name, "must match one of the container's resource requests")]
    return []


def _validate_health(health: dict[str, Any], path: str, seen: set[Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    value = health.get("health", "")
    if value not in HEALTH_VALUES:
        supported = ", ".join(json.dumps(v) for v in HEALTH_VALUES)
        body = f"Unsupported value: {_quote(value)}: supported values: {supported}"
        errors.append(FieldError(f"{path}.health", "FieldValueNotSupported", body))
    if "message" in health and health["message"] is not None:
        errors += _validate_message(health["message"], f"{path}.message")
    rid = health.get("resourceID")
    if rid in seen:
        body = f"Duplicate value: {_quote(rid)}"
        errors.append(FieldError(f"{path}.resourceID", "FieldValueDuplicate", body))
    seen.add(rid)
    return errors


def _validate_message(message: Any, field: str) -> list[FieldError]:
    if message == "":
        return [
            FieldError(
                field, "FieldValueRequired", "Required value: must be non-empty if specified"
            )
        ]
    if len(str(message).encode("utf-8")) > MESSAGE_MAX_BYTES:
        body = f"Too long: may not be more than {MESSAGE_MAX_BYTES} bytes"
        return [FieldError(field, "FieldValueTooLong", body)]
    return []

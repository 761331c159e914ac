"""Cluster-scoped resources and API discovery of the fake API server; DeviceTaintRules.

Generic part: a :class:`~._fakeapi_store.Resource` with ``namespaced=False`` is stored under
the namespace ``""`` and served at ``/apis/<group>/<version>/<plural>[/<name>]``, as the
kube-apiserver serves cluster-scoped resources; :func:`discovery` answers
``GET /apis/<group>/<version>`` with the ``APIResourceList`` of what that version serves
(404 for a version that is not served). To serve another resource, add it to
:data:`RESOURCES` (and, if it has write rules, a case to :func:`prepare`).

DeviceTaintRules (resource.k8s.io ``v1``, ``v1beta2`` and ``v1alpha3``, one storage as in
the real server): the checks of ``ValidateDeviceTaintRule`` the bridge could get wrong
(name a DNS subdomain, taint key a label name, value a label value, effect one of ``None``,
``NoSchedule``, ``NoExecute``) answer 422, and ``timeAdded`` is filled in on create and
renewed when an update changes the effect without changing it, as the registry strategy
does. Which versions serve them is a knob (``FakeApiServer.device_taint_versions``).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from kubelet_dra.testing import _fakeapi_status as status
from kubelet_dra.testing import _fakeapi_store as storage

Obj = dict[str, Any]
GROUP = "resource.k8s.io"
TAINT_VERSIONS = ("v1", "v1beta2", "v1alpha3")
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")
_META = frozenset({"metadata.name"})

DEVICE_TAINT_RULES = {
    version: storage.Resource(
        "devicetaintrules",
        "devicetaintrules",
        "DeviceTaintRule",
        f"{GROUP}/{version}",
        True,
        _META,
        namespaced=False,
    )
    for version in TAINT_VERSIONS
}
#: (group/version, plural) -> resource, merged into the HTTP front end's routes.
RESOURCES: dict[tuple[str, str], storage.Resource] = {
    (res.api_version, res.plural): res for res in DEVICE_TAINT_RULES.values()
}
_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def served(resource: storage.Resource, taint_versions: tuple[str, ...]) -> bool:
    if resource.key == "devicetaintrules":
        return resource.api_version.rsplit("/", 1)[-1] in taint_versions
    return True


def discovery(path: str, taint_versions: tuple[str, ...]) -> Obj | None:
    """The ``APIResourceList`` of ``/apis/<group>/<version>``, or ``None`` (404)."""
    parts = [p for p in path.split("/") if p]
    if len(parts) != 3 or parts[0] != "apis":
        return None
    group_version = f"{parts[1]}/{parts[2]}"
    resources = []
    if group_version == f"{GROUP}/v1":  # what the rest of the fake serves there
        resources.append(_entry("resourceclaims", "ResourceClaim", namespaced=True))
        resources.append(_entry("resourceclaims/status", "ResourceClaim", namespaced=True))
    if parts[1] == GROUP and parts[2] in taint_versions:
        resources.append(_entry("devicetaintrules", "DeviceTaintRule", namespaced=False))
        resources.append(_entry("devicetaintrules/status", "DeviceTaintRule", namespaced=False))
    if not resources:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


def _entry(name: str, kind: str, *, namespaced: bool) -> Obj:
    sub = "/" in name
    return {
        "name": name,
        "singularName": "" if sub else kind.lower(),
        "namespaced": namespaced,
        "kind": kind,
        "verbs": ["get", "patch", "update"] if sub else list(_VERBS),
    }


def prepare(resource: storage.Resource, obj: Obj, old: Obj | None, now: str) -> None:
    """Defaulting and validation of a create (``old`` None) or update; raises 422."""
    if resource.key != "devicetaintrules":
        return
    taint = (obj.setdefault("spec", {})).setdefault("taint", {})
    old_taint = ((old or {}).get("spec") or {}).get("taint") or {}
    if not taint.get("timeAdded"):
        taint["timeAdded"] = old_taint.get("timeAdded") or now
    elif (
        old is not None
        and taint.get("effect") != old_taint.get("effect")
        and taint["timeAdded"] == old_taint.get("timeAdded")
    ):
        taint["timeAdded"] = now
    errors = _rule_errors(obj)
    if errors:
        raise status.invalid("DeviceTaintRule", str(obj["metadata"].get("name", "")), errors)


def _rule_errors(obj: Obj) -> list[status.FieldError]:
    errors = []
    name = str(obj["metadata"].get("name", ""))
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        errors.append(_bad("metadata.name", name, "a lowercase RFC 1123 subdomain"))
    taint = obj["spec"]["taint"]
    key = str(taint.get("key", ""))
    prefix, slash, short = key.rpartition("/")
    if (slash and not _DNS_SUBDOMAIN.fullmatch(prefix)) or not (
        0 < len(short) <= 63 and _NAME.fullmatch(short)
    ):
        errors.append(_bad("spec.taint.key", key, "a valid label name"))
    value = str(taint.get("value", ""))
    if value and not (len(value) <= 63 and _NAME.fullmatch(value)):
        errors.append(_bad("spec.taint.value", value, "a valid label value"))
    effect = taint.get("effect")
    if effect not in TAINT_EFFECTS:
        errors.append(
            status.FieldError(
                "spec.taint.effect",
                "FieldValueNotSupported",
                f'Unsupported value: "{effect}": supported values: '
                + ", ".join(f'"{e}"' for e in TAINT_EFFECTS),
            )
        )
    selector = obj["spec"].get("deviceSelector") or {}
    driver = selector.get("driver")
    if driver is not None and not (len(driver) <= 63 and _DNS_SUBDOMAIN.fullmatch(driver)):
        errors.append(_bad("spec.deviceSelector.driver", driver, "a DNS subdomain"))
    return errors


def _bad(field: str, value: str, what: str) -> status.FieldError:
    return status.FieldError(
        field, "FieldValueInvalid", f'Invalid value: "{value}": must be {what}'
    )


def scoped(resource: storage.Resource, namespace: str | None) -> str | None:
    """The store namespace of a request: ``""`` for cluster-scoped resources."""
    return namespace if resource.namespaced else ""


def strip_namespace(resource: storage.Resource, obj: Obj) -> Obj:
    """Cluster-scoped objects carry no ``metadata.namespace`` in answers."""
    if not resource.namespaced:
        obj = copy.deepcopy(obj)
        obj.get("metadata", {}).pop("namespace", None)
    return obj

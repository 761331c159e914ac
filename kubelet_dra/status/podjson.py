"""Reading the API objects we use (pods, ResourceClaims, Events) as plain JSON, in one place.

No kubelet counterpart as such: the kubelet reads typed Go structs (``v1.Pod``), where a
missing field is a zero value. We keep the API's JSON as decoded, so fields newer than the
``kubernetes`` client survive untouched, and read it through these accessors, which give the
same zero values (a missing ``metadata``, ``spec`` or ``status``, a ``null``, a missing
namespace is ``default``). :data:`Obj` is the one alias for "a JSON object we read",
:data:`MutableObj` for "a JSON object we build or change in place".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Obj = Mapping[str, Any]
"""A JSON object as decoded from the API (read, never modified in place)."""

MutableObj = dict[str, Any]
"""A JSON object we build or change in place (a request body, a stored object)."""

DEFAULT_NAMESPACE = "default"
_EMPTY: Obj = {}


def metadata(obj: Obj) -> Obj:
    return obj.get("metadata") or _EMPTY


def spec(obj: Obj) -> Obj:
    return obj.get("spec") or _EMPTY


def status(obj: Obj) -> Obj:
    return obj.get("status") or _EMPTY


def child(obj: Obj, *fields: str) -> Obj:
    """The object at ``fields`` below ``obj``: empty where one is missing or ``null``."""
    for field in fields:
        obj = obj.get(field) or _EMPTY
    return obj


def uid(obj: Obj) -> str:
    return str(metadata(obj).get("uid") or "")


def name(obj: Obj) -> str:
    return str(metadata(obj).get("name") or "")


def namespace(obj: Obj) -> str:
    """The object's namespace, ``default`` when it names none."""
    return str(metadata(obj).get("namespace") or DEFAULT_NAMESPACE)


def resource_version(obj: Obj) -> str:
    return str(metadata(obj).get("resourceVersion") or "")


def resource_version_number(obj: Obj) -> int:
    """The resourceVersion as a number to order two copies of one object; 0 if not one.

    Kubernetes calls resourceVersions opaque; every server we talk to (etcd
    revisions, the fake) makes them increasing integers, and only copies of
    the same pod are compared.
    """
    try:
        return int(resource_version(obj) or 0)
    except ValueError:
        return 0


def lean(obj: MutableObj) -> MutableObj:
    """``obj`` (a pod or a list of them, as just decoded) without ``managedFields``.

    Nothing here reads them, and they are a quarter of a pod's decoded objects (three
    field managers on a soak pod: 2.2 of its 4.9 KB of JSON, 7 of 28 KB in memory). Every
    pod we hold (the node's pods, the writer's last answers) is kept for minutes, so
    dropping them at decoding keeps that much less alive (docs/memory.md); client-go's
    informers offer the same trim (a ``TransformFunc``). A PATCH or PUT that leaves the
    field out keeps the server's managedFields as they are.
    """
    metadata_ = obj.get("metadata")
    if isinstance(metadata_, dict):
        metadata_.pop("managedFields", None)
    for item in obj.get("items") or ():
        if isinstance(item, dict):
            lean(item)
    return obj


def node_name(pod: Obj) -> str:
    return str(spec(pod).get("nodeName") or "")


def phase(pod: Obj) -> str:
    return str(status(pod).get("phase") or "")


def items(obj: Obj, field: str) -> Sequence[Obj]:
    """A list field of ``obj`` (``spec`` or ``status`` already taken), empty if absent."""
    return obj.get(field) or ()


def resource_claims(pod: Obj) -> Sequence[Obj]:
    """``spec.resourceClaims``: the pod-level claim references."""
    return items(spec(pod), "resourceClaims")


def resource_claim_statuses(pod: Obj) -> Sequence[Obj]:
    """``status.resourceClaimStatuses``: generated claim names of template references."""
    return items(status(pod), "resourceClaimStatuses")


def find_named(entries: Iterable[Obj] | None, wanted: str, key: str = "name") -> Obj | None:
    """The first entry whose ``key`` is ``wanted`` (container statuses, claim references)."""
    return next((e for e in entries or () if e.get(key) == wanted), None)

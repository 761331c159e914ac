"""Planning a pod status write as a JSON patch that tests what it assumes; pure.

Part of ``kube`` (the status writer sends what this plans). Kubelet counterpart:
``pkg/util/pod`` ``PreparePatchBytesForPodStatus``, which diffs the old and new status into a
strategic merge patch; :func:`plan` diffs once into a JSON patch (RFC 6902) instead, sending
only what changed and testing what it assumes (its docstring has the rules).
:func:`assumptions_hold` tells a failed ``test`` from a refused content.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from kubelet_dra.status import claims, jsonpointer, podjson, podstatus
from kubelet_dra.status.podjson import Obj

ARS = "allocatedResourcesStatus"
FIELDS = (claims.CONTAINERS, claims.INIT_CONTAINERS)
# Any \u escape: json.dumps escapes every non-ASCII and control character, Go
# writes non-ASCII as raw UTF-8 (and its own escapes for <>& and U+2028/9).
_GO_ESCAPED = re.compile(r"[<>&]|\\u|\\[bf]")


@dataclasses.dataclass(frozen=True, slots=True)
class ContainerWrite:
    """One container status whose ``allocatedResourcesStatus`` the patch sets."""

    field: str  # claims.CONTAINERS or claims.INIT_CONTAINERS
    index: int
    name: str
    entries: tuple[dict[str, Any], ...]  # empty: the field is removed


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """A planned write: the JSON patch and what it changes."""

    ops: tuple[dict[str, Any], ...]
    containers: tuple[ContainerWrite, ...] = ()
    condition: dict[str, Any] | None = None

    @property
    def fields(self) -> frozenset[str]:
        """The container status lists the patch touches."""
        return frozenset(c.field for c in self.containers)


def plan(
    pod: Obj,
    desired: podstatus.Desired,
    *,
    now: float,
    container_status: bool = True,
    condition: bool = True,
) -> Plan | None:
    """The patch that makes ``pod``'s status say ``desired``, or ``None`` if it already does.

    ``container_status`` and ``condition`` switch each half off (the
    ``--container-status`` mode, an empty condition type). Like
    ``podstatus.merge``, a container status that does not exist is never
    added: the kubelet owns the list.

    The patch is a JSON patch (RFC 6902):

    - only ``allocatedResourcesStatus`` of each changed container status is
      sent, with a ``test`` of the container's name at that index and of the
      entries it replaces, so a concurrent writer's other fields and entries are
      never clobbered and a kubelet updating restart counts is no conflict;
    - our condition replaces the one of its type at a tested index; only adding
      a first condition (no list or no such type yet) is guarded by the
      resourceVersion;
    - the first operation tests the pod UID: a pod replaced under the same name
      never receives the old pod's status.

    A refused patch (422) is either a failed ``test`` (someone wrote first:
    re-read, re-plan) or the server refusing the content: :func:`assumptions_hold`
    on the re-read pod tells which. The status is compared once, here, through
    ``podstatus.merged_entries`` and ``podstatus.merged_condition``.
    """
    status = podjson.status(pod)
    ops: list[dict[str, Any]] = [_test("/metadata/uid", podjson.metadata(pod).get("uid"))]
    writes = _container_writes(status, desired) if container_status else []
    for write, before in writes:
        ops += _container_ops(write, before, pod)
    ours = None
    if condition and desired.condition is not None:
        ours, condition_ops = _condition_plan(status, desired.condition, now, pod)
        ops += condition_ops
    if not writes and ours is None:
        return None
    return Plan(tuple(ops), tuple(w for w, _ in writes), ours)


def assumptions_hold(pod: Obj, ops: Iterable[Obj]) -> bool:
    """Whether every ``test`` operation of ``ops`` holds on ``pod``."""
    return all(
        jsonpointer.resolve(pod, op["path"]) == op["value"] for op in ops if op["op"] == "test"
    )


# -- internals -------------------------------------------------------------------


def _container_writes(
    status: Obj, desired: podstatus.Desired
) -> list[tuple[ContainerWrite, list[Any] | None]]:
    """Each changed container status in list order, with the entries it had (or ``None``)."""
    writes: list[tuple[ContainerWrite, list[Any] | None]] = []
    for field in FIELDS:
        for i, cs in enumerate(podjson.items(status, field)):
            managed = desired.containers.get((field, str(cs.get("name", ""))))
            if managed is None:
                continue
            merged = podstatus.merged_entries(cs.get(ARS), managed)
            if merged is not None:
                name = str(cs.get("name", ""))
                writes.append((ContainerWrite(field, i, name, tuple(merged)), cs.get(ARS)))
    return writes


def _container_ops(
    write: ContainerWrite, before: list[Any] | None, pod: Obj
) -> list[dict[str, Any]]:
    path = f"/status/{write.field}/{write.index}"
    ops = [_test(f"{path}/name", write.name)]
    if before is not None:
        ops.append(_guard(f"{path}/{ARS}", before, pod))
    if write.entries:
        ops.append({"op": "add", "path": f"{path}/{ARS}", "value": list(write.entries)})
    else:
        ops.append({"op": "remove", "path": f"{path}/{ARS}"})
    return ops


def _condition_plan(
    status: Obj, wanted: Obj, now: float, pod: Obj
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    conditions: Sequence[Obj] | None = status.get("conditions")
    for j, current in enumerate(conditions or ()):
        if current.get("type") == wanted["type"]:
            ours = podstatus.merged_condition(current, wanted, now)
            if ours is None:
                return None, []
            path = f"/status/conditions/{j}"
            return ours, [
                _test(f"{path}/type", wanted["type"]),
                {"op": "replace", "path": path, "value": ours},
            ]
    ours = podstatus.merged_condition(None, wanted, now)
    if conditions is None:
        return ours, [_rv_test(pod), {"op": "add", "path": "/status/conditions", "value": [ours]}]
    return ours, [_rv_test(pod), {"op": "add", "path": "/status/conditions/-", "value": ours}]


def _test(path: str, value: Any) -> dict[str, Any]:
    return {"op": "test", "path": path, "value": value}


def _rv_test(pod: Obj) -> dict[str, Any]:
    return _test("/metadata/resourceVersion", podjson.metadata(pod).get("resourceVersion"))


def _guard(path: str, value: Any, pod: Obj) -> dict[str, Any]:
    """A ``test`` that ``path`` still holds ``value``, or the resourceVersion's.

    The apiserver's JSON patch library compares scalars by their raw JSON
    text, and the client escapes differently from Go (non-ASCII, ``<>&``,
    control characters): such a value would never test equal, found with a
    real kube-apiserver. Those fall back to the resourceVersion.
    """
    text = json.dumps(value)  # ASCII always: non-ASCII comes out as \uXXXX
    if not _GO_ESCAPED.search(text):
        return _test(path, value)
    return _rv_test(pod)

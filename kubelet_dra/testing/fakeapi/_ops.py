"""Verbs of the fake API server: create, replace, patch, delete, with the apiserver's write rules.

Mimics the kube-apiserver's generic registry ``Store`` plus the pod strategies
(``pkg/registry/core/pod/strategy.go``): creates reset status, main-resource writes keep status,
status writes keep everything but status, ``metadata.resourceVersion`` (and, in a PUT,
``metadata.uid``) in a body are preconditions (409; a patched uid is an immutable-field 422),
feature-gated fields are dropped before validation, validation failures are 422, and an update
that changes nothing does not bump the resourceVersion.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from typing import Any

from kubelet_dra.testing.fakeapi import _patch as patching
from kubelet_dra.testing.fakeapi import _status as status
from kubelet_dra.testing.fakeapi import _store as storage

Obj = dict[str, Any]
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
_PATCHERS: dict[str, Callable[[Any, Any], Any]] = {
    JSON_PATCH: patching.json_patch,
    MERGE_PATCH: patching.merge_patch,
    STRATEGIC_PATCH: patching.strategic_merge_patch,
}
_SYSTEM_META = ("uid", "creationTimestamp", "resourceVersion", "namespace", "name", "generateName")


class Backend:
    """The write rules over a :class:`Store`; its switches are the fault and gate knobs."""

    def __init__(self, store: storage.Store) -> None:
        self.store = store
        self.health_gate = True  # ResourceHealthStatus on the apiserver
        self.message_gate = True  # ResourceHealthStatusMessage on the apiserver
        self.conflict_first_write = False
        self._lock = threading.Lock()
        self._conflicted: set[str] = set()

    # create / delete

    def create(
        self, res: storage.Resource, namespace: str, body: Any, *, keep_status: bool = False
    ) -> Obj:
        obj = _require_object(body)
        meta = obj.setdefault("metadata", {})
        if meta.get("namespace") not in (None, "", namespace):
            raise status.bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        if not meta.get("name") and not meta.get("generateName"):
            error = status.FieldError(
                "metadata.name",
                "FieldValueRequired",
                "Required value: name or generateName is required",
            )
            raise status.invalid(res.kind, "", [error])
        if res.namespaced:
            meta["namespace"] = namespace
        for key in ("uid", "resourceVersion", "creationTimestamp"):
            meta.pop(key, None)
        if res.has_status and not keep_status:
            # The create strategies discard client-written status.
            obj["status"] = _initial_status(res, obj)
        if res.prepare is not None:
            res.prepare(obj, None, storage.now_rfc3339())
        return self.store.create(res, obj)

    def delete(self, res: storage.Resource, namespace: str, name: str, options: Any = None) -> Obj:
        pre = (options or {}).get("preconditions") or {} if isinstance(options, dict) else {}

        def check(current: Obj) -> None:
            _check_preconditions(res, current, pre.get("uid"), pre.get("resourceVersion"))

        return self.store.delete(res, namespace, name, check)

    # updates

    def replace(
        self,
        res: storage.Resource,
        namespace: str,
        name: str,
        body: Any,
        *,
        subresource: str | None,
    ) -> Obj:
        obj = _require_object(body)
        meta = obj.get("metadata") or {}
        if meta.get("name") not in (None, name):
            raise status.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the "
                f"URL ({name})"
            )

        def mutate(current: Obj) -> Obj:
            self._maybe_conflict_first(res, current, subresource)
            _check_preconditions(res, current, meta.get("uid"), meta.get("resourceVersion"))
            return self._compose(res, current, obj, subresource)

        return self.store.update(res, namespace, name, mutate)

    def patch(
        self,
        res: storage.Resource,
        namespace: str,
        name: str,
        body: Any,
        *,
        content_type: str,
        subresource: str | None,
    ) -> Obj:
        patcher = _PATCHERS.get(content_type)
        if patcher is None:
            raise status.ApiError(
                status.status_body(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: {JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_PATCH}",
                )
            )

        def mutate(current: Obj) -> Obj:
            self._maybe_conflict_first(res, current, subresource)
            patched = _apply(patcher, current, body)
            meta = patched.get("metadata") or {}
            _check_preconditions(res, current, None, meta.get("resourceVersion"))
            # A uid in a patch is not a precondition (as it is in a PUT): it is merged into
            # the object and then fails validation as a change of an immutable field.
            uid = meta.get("uid")
            if uid and uid != current["metadata"]["uid"]:
                text = f"Invalid value: {json.dumps(str(uid))}: field is immutable"
                error = status.FieldError("metadata.uid", "FieldValueInvalid", text)
                raise status.invalid(res.kind, current["metadata"]["name"], [error])
            return self._compose(res, current, patched, subresource)

        return self.store.update(res, namespace, name, mutate)

    def set_status(
        self,
        res: storage.Resource,
        namespace: str,
        name: str,
        new_status: Obj,
        *,
        force: bool = False,
    ) -> Obj:
        """A trusted status replacement (kubelet-like), still gated and validated."""

        def mutate(current: Obj) -> Obj:
            return self._compose(res, current, {"status": copy.deepcopy(new_status)}, "status")

        return self.store.update(res, namespace, name, mutate, force=force)

    def kubelet_write(self, namespace: str, name: str, compute: Callable[[Obj], list[Obj]]) -> Obj:
        """Replace ``status.containerStatuses`` whole, as the kubelet's status manager does."""

        def mutate(current: Obj) -> Obj:
            new_status = copy.deepcopy(current.get("status") or {})
            new_status["containerStatuses"] = compute(copy.deepcopy(current))
            return self._compose(storage.PODS, current, {"status": new_status}, "status")

        # Always a new resourceVersion: the modelled kubelet write also changed something the
        # test does not look at (probe results, timestamps).
        return self.store.update(storage.PODS, namespace, name, mutate, force=True)

    # helpers

    def _maybe_conflict_first(
        self, res: storage.Resource, current: Obj, subresource: str | None
    ) -> None:
        if not (self.conflict_first_write and res is storage.PODS and subresource == "status"):
            return
        uid = current["metadata"]["uid"]
        with self._lock:
            if uid in self._conflicted:
                return
            self._conflicted.add(uid)
        raise status.conflict(res.plural, current["metadata"]["name"])

    def _compose(
        self, res: storage.Resource, current: Obj, proposed: Obj, subresource: str | None
    ) -> Obj:
        if subresource == "status":
            new = copy.deepcopy(current)
            new["status"] = copy.deepcopy(proposed.get("status") or {})
        else:
            new = copy.deepcopy(proposed)
            meta = new.setdefault("metadata", {})
            for key in _SYSTEM_META:
                if key in current["metadata"]:
                    meta[key] = current["metadata"][key]
            new["kind"], new["apiVersion"] = current["kind"], current["apiVersion"]
            if res.has_status and "status" in current:
                new["status"] = copy.deepcopy(current["status"])
        if res is storage.PODS:
            self._pod_status_rules(new)
        elif subresource is None and res.prepare is not None:
            res.prepare(new, current, storage.now_rfc3339())
        return new

    def _pod_status_rules(self, pod: Obj) -> None:
        pod_status = pod.setdefault("status", {})
        status.drop_gated_fields(
            pod_status, health_gate=self.health_gate, message_gate=self.message_gate
        )
        errors = status.validate_pod_status(pod)
        if errors:
            raise status.invalid("Pod", pod["metadata"]["name"], errors)


def _require_object(body: Any) -> Obj:
    if not isinstance(body, dict):
        raise status.bad_request("the body of the request must be a JSON object")
    return copy.deepcopy(body)


def _apply(patcher: Callable[[Any, Any], Any], current: Obj, body: Any) -> Obj:
    try:
        patched = patcher(current, body)
    except patching.PatchError as err:
        if err.code == 422:
            raise status.unprocessable_patch(str(err)) from err
        raise status.bad_request(str(err)) from err
    if not isinstance(patched, dict):
        raise status.bad_request("the patched object is not a JSON object")
    return patched


def _check_preconditions(res: storage.Resource, current: Obj, uid: Any, rv: Any) -> None:
    meta = current["metadata"]
    if uid and uid != meta["uid"]:
        key = f"/registry/{res.plural}/{meta.get('namespace', '')}/{meta['name']}"
        raise status.uid_conflict(res.plural, key, meta["name"], str(uid), meta["uid"])
    if rv and str(rv) != meta["resourceVersion"]:
        raise status.conflict(res.plural, meta["name"])


def _initial_status(res: storage.Resource, obj: Obj) -> Obj:
    if res is storage.PODS:
        return {"phase": "Pending", "qosClass": _qos_class(obj.get("spec") or {})}
    return {}


def _qos_class(spec: Obj) -> str:
    containers = (spec.get("containers") or []) + (spec.get("initContainers") or [])
    resources = [c.get("resources") or {} for c in containers]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    guaranteed = all(
        (r.get("limits") or {}).get(k) is not None
        and (r.get("requests") or {}).get(k, (r.get("limits") or {}).get(k))
        == (r.get("limits") or {}).get(k)
        for r in resources
        for k in ("cpu", "memory")
    )
    return "Guaranteed" if guaranteed else "Burstable"

"""Extra resource types of the fake API server, stored as given: list, get, create, delete.

For API types the stand-in does not model (no status rules, no validation, no watch), such as
the cluster-scoped ``resource.k8s.io`` DeviceTaintRules that a reader lists. A type is served
only after :meth:`GenericResources.serve`, so a version a test did not serve answers 404 like a
kube-apiserver that does not serve it. Lists page with ``limit`` and ``continue`` and filter on
``metadata.name`` field selectors and label selectors; every write takes the next value of the
store's one resourceVersion counter. Kept apart from the modelled resources (pods, claims,
events) so tests can add types without touching their rules.
"""

from __future__ import annotations

import base64
import copy
import json
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from kubelet_dra.testing import _fakeapi_status as status
from kubelet_dra.testing import _fakeapi_store as storage

Obj = dict[str, Any]


@dataclass(frozen=True)
class GenericResource:
    """A served type: ``group_version`` like ``resource.k8s.io/v1``, ``plural`` its path."""

    group_version: str
    plural: str
    kind: str
    namespaced: bool = False

    @property
    def selectable(self) -> storage.Resource:
        fields = frozenset({"metadata.name", "metadata.namespace"})
        return storage.Resource(
            self.plural, self.plural, self.kind, self.group_version, False, fields
        )


@dataclass(frozen=True)
class GenericRoute:
    resource: GenericResource
    namespace: str | None
    name: str | None


class GenericResources:
    """The extra types of one server and their objects."""

    def __init__(self, store: storage.Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._types: dict[tuple[str, str], GenericResource] = {}
        self._objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}

    def serve(self, resource: GenericResource) -> None:
        with self._lock:
            self._types[(resource.group_version, resource.plural)] = resource
            self._objects.setdefault((resource.group_version, resource.plural), {})

    # trusted access (the test's setup)

    def create(self, group_version: str, plural: str, obj: Obj, namespace: str = "") -> Obj:
        res = self._type(group_version, plural)
        return self._create(res, namespace if res.namespaced else "", obj)

    def delete(self, group_version: str, plural: str, name: str, namespace: str = "") -> Obj:
        res = self._type(group_version, plural)
        with self._lock:
            objects = self._objects[(res.group_version, res.plural)]
            gone = objects.pop((namespace if res.namespaced else "", name), None)
        if gone is None:
            raise status.not_found(res.plural, name)
        return gone

    def objects(self, group_version: str, plural: str) -> list[Obj]:
        res = self._type(group_version, plural)
        with self._lock:
            return [
                copy.deepcopy(o)
                for _, o in sorted(self._objects[(res.group_version, plural)].items())
            ]

    # HTTP

    def route(self, path: str) -> GenericRoute | None:
        """The served type a URL path names, or ``None`` (then the modelled routes apply)."""
        parts = [p for p in path.split("/") if p]
        if len(parts) < 4 or parts[0] != "apis":
            return None
        group_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        with self._lock:
            res = self._types.get((group_version, rest[0]))
        if res is None or len(rest) > 2 or (namespace is not None and not res.namespaced):
            return None
        return GenericRoute(res, namespace, rest[1] if len(rest) == 2 else None)

    def handle(
        self, method: str, route: GenericRoute, query: dict[str, str], body: Any
    ) -> tuple[int, Obj]:
        res, name = route.resource, route.name
        namespace = route.namespace or ""
        if method == "GET" and name is None:
            return 200, self._list(res, route.namespace, query)
        if method == "GET" and name is not None:
            with self._lock:
                obj = self._objects[(res.group_version, res.plural)].get((namespace, name))
            if obj is None:
                raise status.not_found(res.plural, name)
            return 200, copy.deepcopy(obj)
        if method == "POST" and name is None and (route.namespace is not None) == res.namespaced:
            if not isinstance(body, dict):
                raise status.bad_request("the body of the request must be a JSON object")
            return 201, self._create(res, namespace, body)
        if method == "DELETE" and name is not None:
            gone = self.delete(res.group_version, res.plural, name, namespace)
            return 200, gone
        raise status.ApiError(
            status.status_body(
                405,
                "MethodNotAllowed",
                f"the server does not allow this method on the requested resource ({method})",
                {},
            )
        )

    # internals

    def _type(self, group_version: str, plural: str) -> GenericResource:
        with self._lock:
            res = self._types.get((group_version, plural))
        if res is None:
            raise KeyError(f"{plural}.{group_version} is not served; call serve_resource first")
        return res

    def _create(self, res: GenericResource, namespace: str, obj: Obj) -> Obj:
        new = copy.deepcopy(obj)
        meta = new.setdefault("metadata", {})
        if not meta.get("name"):
            raise status.invalid(
                res.kind,
                "",
                [status.FieldError("metadata.name", "FieldValueRequired", "Required value")],
            )
        if res.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = storage.now_rfc3339()
        meta["generation"] = 1
        new["kind"], new["apiVersion"] = res.kind, res.group_version
        with self._store.cond:  # one resourceVersion counter for the whole server
            self._store.rv += 1
            meta["resourceVersion"] = str(self._store.rv)
        with self._lock:
            objects = self._objects[(res.group_version, res.plural)]
            if (namespace, meta["name"]) in objects:
                raise status.already_exists(res.plural, meta["name"])
            objects[(namespace, meta["name"])] = new
        return copy.deepcopy(new)

    def _list(self, res: GenericResource, namespace: str | None, query: dict[str, str]) -> Obj:
        selector = storage.Selector(
            res.selectable, query.get("fieldSelector", ""), query.get("labelSelector", "")
        )
        after = _continue_key(query.get("continue"))
        limit = int(query.get("limit") or 0) if (query.get("limit") or "0").isdigit() else 0
        with self._lock:
            objects = sorted(self._objects[(res.group_version, res.plural)].items())
        matching = [
            o
            for key, o in objects
            if (namespace is None or key[0] == namespace)
            and (after is None or key > after)
            and selector.matches(o)
        ]
        with self._store.cond:
            rv = self._store.rv
        meta: Obj = {"resourceVersion": str(rv)}
        page = matching if limit <= 0 else matching[:limit]
        if len(page) < len(matching):
            last = page[-1]["metadata"]
            key = [last.get("namespace", ""), last["name"]]
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps({"start": key}).encode()
            ).decode()
            meta["remainingItemCount"] = len(matching) - len(page)
        items = []
        for obj in page:
            item = copy.deepcopy(obj)
            item.pop("kind", None)
            item.pop("apiVersion", None)
            items.append(item)
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.group_version,
            "metadata": meta,
            "items": items,
        }


def _continue_key(token: str | None) -> tuple[str, str] | None:
    if not token:
        return None
    try:
        raw = json.loads(base64.urlsafe_b64decode(token.encode()))["start"]
        return str(raw[0]), str(raw[1])
    except (ValueError, KeyError, TypeError, IndexError) as err:
        raise status.bad_request(f"continue key is not valid: {err}") from err

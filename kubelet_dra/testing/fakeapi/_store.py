"""Object storage of the fake API server: objects, one resourceVersion counter, watch history.

Mimics etcd plus the kube-apiserver's watch cache: every write takes the next value of one
global resourceVersion, each write is appended to a bounded event history, and a watch that
starts from a resourceVersion older than the retained history is told "410 Expired". Field
and label selectors are evaluated here the way the registry's ``GetAttrs`` functions do.
"""

from __future__ import annotations

import bisect
import collections
import copy
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubelet_dra.testing.fakeapi import _status as status

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    """One served resource type; ``key`` names it in the store, ``fields`` its field labels."""

    key: str
    plural: str
    kind: str
    api_version: str
    has_status: bool
    fields: frozenset[str]
    namespaced: bool = True  # cluster-scoped objects are stored under namespace ""
    #: The type's defaulting and validation on create (``old`` None) and main-resource
    #: update, as a registry strategy does: ``prepare(obj, old, now)`` raises a 422 ApiError.
    prepare: Callable[[Obj, Obj | None, str], None] | None = field(default=None, compare=False)


META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})
POD_FIELDS = META_FIELDS | {
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
}
EVENT_FIELDS = META_FIELDS | {
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
}

PODS = Resource("pods", "pods", "Pod", "v1", True, POD_FIELDS)
CLAIMS = Resource(
    "resourceclaims", "resourceclaims", "ResourceClaim", "resource.k8s.io/v1", True, META_FIELDS
)
EVENTS = Resource("events", "events", "Event", "v1", False, EVENT_FIELDS)
EVENTS_V1 = Resource(
    "events.k8s.io/events",
    "events",
    "Event",
    "events.k8s.io/v1",
    False,
    META_FIELDS
    | {
        "reason",
        "type",
        "regarding.kind",
        "regarding.name",
        "regarding.namespace",
        "reportingController",
    },
)
RESOURCES = (PODS, CLAIMS, EVENTS, EVENTS_V1)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Change:
    """One stored write: ``obj`` is the new state (for DELETED the last one), ``prev`` the old."""

    type: str
    resource: str
    rv: int
    obj: Obj
    prev: Obj | None


class Expired(Exception):
    """The requested resourceVersion is older than the retained history."""


# --- selectors ---------------------------------------------------------------------------------


class Selector:
    """A parsed field selector plus label selector; an empty selector matches everything."""

    def __init__(self, resource: Resource, fields: str = "", labels: str = "") -> None:
        self._fields = [_parse_field_term(t, resource) for t in _split(fields)]
        self._labels = [_parse_label_term(t) for t in _split(labels)]

    def matches(self, obj: Obj) -> bool:
        return all(t(obj) for t in self._fields) and all(t(obj) for t in self._labels)


def _split(selector: str) -> list[str]:
    # Commas inside "in (a,b)" do not separate terms.
    return [t.strip() for t in re.split(r",(?![^()]*\))", selector or "") if t.strip()]


def _field_value(obj: Obj, label: str) -> str:
    node: Any = obj
    for part in label.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, bool):
        return "true" if node else "false"
    if label == "source" and isinstance(node, dict):  # core Event's "source" is source.component
        return str(node.get("component", ""))
    return "" if node is None else str(node)


def _parse_field_term(term: str, resource: Resource) -> Callable[[Obj], bool]:
    match = re.fullmatch(r"([^=!]+)(==|!=|=)(.*)", term)
    if match is None:
        raise status.bad_request(f"invalid selector: '{term}'; can't understand '{term}'")
    label, op, value = match.groups()
    if label not in resource.fields:
        raise status.bad_request(f"field label not supported: {label}")
    negate = op == "!="
    return lambda obj: (_field_value(obj, label) == value) != negate


def _labels_of(obj: Obj) -> dict[str, str]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels if isinstance(labels, dict) else {}


def _parse_label_term(term: str) -> Callable[[Obj], bool]:
    set_match = re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)", term)
    if set_match:
        key, op, raw = set_match.groups()
        values = {v.strip() for v in raw.split(",")}
        if op == "in":
            return lambda obj: _labels_of(obj).get(key) in values
        return lambda obj: _labels_of(obj).get(key) not in values
    eq_match = re.fullmatch(r"([\w./-]+)\s*(==|!=|=)\s*([\w.-]*)", term)
    if eq_match:
        key, op, value = eq_match.groups()
        if op == "!=":
            return lambda obj: _labels_of(obj).get(key) != value
        return lambda obj: _labels_of(obj).get(key) == value
    exists = re.fullmatch(r"(!?)([\w./-]+)", term)
    if exists:
        negate, key = exists.groups()
        return lambda obj: (key in _labels_of(obj)) != bool(negate)
    raise status.bad_request(f"unable to parse requirement: {term!r}")


# --- the store ---------------------------------------------------------------------------------


class Store:
    """Thread-safe objects and history; ``cond`` wakes watchers on every write."""

    def __init__(self, *, history_limit: int = 1000, first_rv: int = 1000) -> None:
        self.cond = threading.Condition()
        self.rv = first_rv
        self.history_limit = history_limit
        self.generation = 0  # bumped to end all open watches
        self.bookmark_epoch = 0  # bumped to make every open watch send a bookmark now
        # Keyed by Resource.key; types registered later (_fakeapi_generic) get theirs on use.
        self._objects: dict[str, dict[tuple[str, str], Obj]] = collections.defaultdict(dict)
        self._history: list[Change] = []
        self._history_rvs: list[int] = []
        self._oldest_rv = first_rv  # a watch may resume from this version or any later one

    # reads

    def get(self, resource: Resource, namespace: str, name: str) -> Obj:
        with self.cond:
            obj = self._objects[resource.key].get((namespace, name))
            if obj is None:
                raise status.not_found(resource.plural, name)
            return copy.deepcopy(obj)

    def select(
        self, resource: Resource, namespace: str | None, selector: Selector
    ) -> tuple[list[Obj], int]:
        with self.cond:
            return self._matching(resource, namespace, selector), self.rv

    def select_page(
        self,
        resource: Resource,
        namespace: str | None,
        selector: Selector,
        *,
        after: tuple[str, str] | None,
        limit: int,
    ) -> tuple[list[Obj], int, int]:
        """One page of a list: matches after the key ``after``, at most ``limit`` (0: all).

        Returns the page, how many matches follow it, and the resourceVersion. The items are
        shallow copies, to be serialized and not modified: stored objects are never changed in
        place (a write stores a new object), so no deep copy is needed, and a full deep copy per
        page made a 10,000-pod list quadratic.
        """
        with self.cond:
            objects = self._objects[resource.key]
            keys = sorted(objects)
            start = bisect.bisect_right(keys, after) if after is not None else 0
            page: list[Obj] = []
            remaining = 0
            for key in keys[start:]:
                obj = objects[key]
                if (namespace is not None and key[0] != namespace) or not selector.matches(obj):
                    continue
                if limit <= 0 or len(page) < limit:
                    page.append(dict(obj))
                else:
                    remaining += 1
            return page, remaining, self.rv

    def _matching(self, resource: Resource, namespace: str | None, selector: Selector) -> list[Obj]:
        items = sorted(self._objects[resource.key].items())
        return [
            copy.deepcopy(obj)
            for (ns, _), obj in items
            if (namespace is None or ns == namespace) and selector.matches(obj)
        ]

    # writes

    def create(self, resource: Resource, obj: Obj) -> Obj:
        meta = obj.setdefault("metadata", {})
        if resource.namespaced:
            namespace = meta.setdefault("namespace", "default")
        else:
            namespace = ""
            meta.pop("namespace", None)
        with self.cond:
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            key = (namespace, meta["name"])
            if key in self._objects[resource.key]:
                raise status.already_exists(resource.plural, meta["name"])
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_rfc3339()
            obj["kind"], obj["apiVersion"] = resource.kind, resource.api_version
            self._commit(resource, key, obj, "ADDED", None)
            return copy.deepcopy(obj)

    def update(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        mutate: Callable[[Obj], Obj],
        *,
        force: bool = False,
    ) -> Obj:
        """Replace an object with ``mutate(copy)``; a no-op keeps its resourceVersion."""
        with self.cond:
            current = self._objects[resource.key].get((namespace, name))
            if current is None:
                raise status.not_found(resource.plural, name)
            new = mutate(copy.deepcopy(current))
            if new == current and not force:
                return copy.deepcopy(current)
            self._commit(resource, (namespace, name), new, "MODIFIED", current)
            return copy.deepcopy(new)

    def delete(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        check: Callable[[Obj], None] | None = None,
    ) -> Obj:
        with self.cond:
            current = self._objects[resource.key].get((namespace, name))
            if current is None:
                raise status.not_found(resource.plural, name)
            if check is not None:
                check(current)
            gone = copy.deepcopy(current)
            self.rv += 1
            gone["metadata"]["resourceVersion"] = str(self.rv)
            del self._objects[resource.key][(namespace, name)]
            self._record(Change("DELETED", resource.key, self.rv, gone, current))
            return copy.deepcopy(gone)

    def _commit(
        self, resource: Resource, key: tuple[str, str], obj: Obj, kind: str, prev: Obj | None
    ) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._objects[resource.key][key] = obj
        self._record(Change(kind, resource.key, self.rv, copy.deepcopy(obj), prev))

    def _record(self, change: Change) -> None:
        self._history.append(change)
        self._history_rvs.append(change.rv)
        while len(self._history) > self.history_limit:
            dropped = self._history.pop(0)
            self._history_rvs.pop(0)
            self._oldest_rv = dropped.rv
        self.cond.notify_all()

    # watch support

    def expire_history(self) -> None:
        """Forget all history: every watch from an earlier resourceVersion now gets 410."""
        with self.cond:
            self._history.clear()
            self._history_rvs.clear()
            self._oldest_rv = self.rv

    def end_watches(self) -> None:
        with self.cond:
            self.generation += 1
            self.cond.notify_all()

    def request_bookmarks(self) -> None:
        with self.cond:
            self.bookmark_epoch += 1
            self.cond.notify_all()

    def changes_after(self, resource: Resource, rv: int) -> list[Change]:
        """Changes of one resource after ``rv``; caller holds ``cond``."""
        if rv < self._oldest_rv:
            raise Expired(f"too old resource version: {rv} ({self._oldest_rv})")
        start = bisect.bisect_right(self._history_rvs, rv)
        return [c for c in self._history[start:] if c.resource == resource.key]

    def snapshot(
        self, resource: Resource, namespace: str | None, selector: Selector
    ) -> Iterator[Obj]:
        """Current objects for a watch's initial ADDED events; caller holds ``cond``."""
        yield from self._matching(resource, namespace, selector)

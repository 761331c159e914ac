"""The type registry of the fake API server: which resource types it serves, where, and how.

Mimics the kube-apiserver's REST mapping plus its discovery (``GET /apis/<group>/<version>``,
an ``APIResourceList``). Every type, modelled or not, is one :class:`~._fakeapi_store.Resource`
served by the same store, write rules (``_fakeapi_ops``) and HTTP verbs (``_fakeapi_http``).
:class:`Types` says which are built in and how a test adds one.
"""

from __future__ import annotations

import threading

from kubelet_dra.status.podjson import MutableObj
from kubelet_dra.testing.fakeapi import _cluster as cluster
from kubelet_dra.testing.fakeapi import _store as storage

_BUILT_IN = (*storage.RESOURCES, *cluster.DEVICE_TAINT_RULES.values())
_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


class Types:
    """The types of one server, keyed by ``(group/version, plural)``, and which are served.

    Built in and served from the start: pods, core and events.k8s.io events, ResourceClaims, and
    DeviceTaintRules in ``v1``, ``v1beta2`` and ``v1alpha3`` (one storage; which versions answer is
    the ``taint_versions`` knob). A test adds any other type with :meth:`Types.serve`; it is then
    stored as given (no status, no validation beyond a required name) under its own group/version,
    and until then its URLs answer 404 like a kube-apiserver that does not serve it. Serving a
    version of a built-in type (a DeviceTaintRule version) switches that version on.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._types = {(res.api_version, res.plural): res for res in _BUILT_IN}
        self._served = set(self._types)

    def serve(self, group_version: str, plural: str, kind: str, *, namespaced: bool) -> None:
        """Serve a type from now on; an unknown one is registered, stored as given."""
        with self._lock:
            if (group_version, plural) not in self._types:
                self._types[(group_version, plural)] = storage.Resource(
                    f"{group_version}/{plural}",  # one storage per version: distinct types
                    plural,
                    kind,
                    group_version,
                    False,
                    storage.META_FIELDS,
                    namespaced=namespaced,
                )
            self._served.add((group_version, plural))

    def lookup(self, group_version: str, plural: str) -> storage.Resource | None:
        """The served type, or ``None`` (the server answers 404)."""
        with self._lock:
            if (group_version, plural) not in self._served:
                return None
            return self._types[(group_version, plural)]

    def get(self, group_version: str, plural: str) -> storage.Resource:
        """The served type for a test's direct access; ``KeyError`` names the fix."""
        res = self.lookup(group_version, plural)
        if res is None:
            raise KeyError(f"{plural}.{group_version} is not served; call serve_resource first")
        return res

    # DeviceTaintRule versions (the bridge's fallback tests switch them off)

    @property
    def taint_versions(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(v for v in cluster.TAINT_VERSIONS if self._taint_key(v) in self._served)

    @taint_versions.setter
    def taint_versions(self, versions: tuple[str, ...]) -> None:
        with self._lock:
            for version in cluster.TAINT_VERSIONS:
                if version in versions:
                    self._served.add(self._taint_key(version))
                else:
                    self._served.discard(self._taint_key(version))

    @staticmethod
    def _taint_key(version: str) -> tuple[str, str]:
        return f"{cluster.GROUP}/{version}", "devicetaintrules"

    # discovery

    def discovery(self, path: str) -> MutableObj | None:
        """The ``APIResourceList`` of ``/apis/<group>/<version>``, or ``None`` (404)."""
        parts = [p for p in path.split("/") if p]
        if len(parts) != 3 or parts[0] != "apis":
            return None
        group_version = f"{parts[1]}/{parts[2]}"
        with self._lock:
            served = sorted(
                (res for key, res in self._types.items() if key in self._served),
                key=lambda res: res.plural,
            )
        resources = []
        for res in served:
            if res.api_version == group_version:
                resources.append(_entry(res.plural, res.kind, namespaced=res.namespaced))
                if res.has_status:
                    resources.append(_entry(f"{res.plural}/status", res.kind, res.namespaced))
        if not resources:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }


def _entry(name: str, kind: str, namespaced: bool) -> MutableObj:
    sub = "/" in name
    return {
        "name": name,
        "singularName": "" if sub else kind.lower(),
        "namespaced": namespaced,
        "kind": kind,
        "verbs": ["get", "patch", "update"] if sub else list(_VERBS),
    }

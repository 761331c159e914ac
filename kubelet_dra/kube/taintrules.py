"""DeviceTaintRule calls of the taint bridge, and the one version discovery for them.

Part of ``kube``: the requests go through :class:`kube.api.Api` (its call wrapper and its
error translation, so a failure is a :class:`kube.CallError`), on plain JSON, so a field
the client's models do not know survives. No kubelet counterpart (KEP-5055's "external
health monitor" writes these rules; the kubelet only reads them).

:func:`discover` finds the newest served version of ``devicetaintrules`` in
``resource.k8s.io``: ``v1`` (GA in 1.37), else ``v1beta2``, else ``v1alpha3``. The three
versions have the same fields the bridge and the kubectl plugin use.
"""

from __future__ import annotations

import builtins
import urllib.parse
from collections.abc import Iterator
from typing import Any

from kubelet_dra.kube import api as kube_api
from kubelet_dra.status.podjson import MutableObj

RESOURCE = "devicetaintrules"
GROUP = "resource.k8s.io"
#: The versions that serve DeviceTaintRules, newest first (v1 from 1.37, v1beta2 in 1.36).
VERSIONS = ("v1", "v1beta2", "v1alpha3")
PAGE_SIZE = 500


def discover(client: kube_api.ApiClient) -> str | None:
    """The newest version serving ``devicetaintrules``, or ``None``.

    A version that is not served answers 404; a served version without the resource
    (``DRADeviceTaintRules`` off) lists other resources only.
    """
    return discover_with(kube_api.Api(client, async_patch=False))


def discover_with(api: kube_api.Api) -> str | None:
    """:func:`discover` through an existing :class:`kube.api.Api`."""
    for version in VERSIONS:
        try:
            answer = api.get_json(f"discover {GROUP}/{version}", f"/apis/{GROUP}/{version}")
        except kube_api.CallError as exc:
            if exc.status == 404:
                continue
            raise
        names = {r.get("name") for r in answer.get("resources") or [] if isinstance(r, dict)}
        if RESOURCE in names:
            return version
    return None


def list_pages(
    api: kube_api.Api, version: str, query: list[tuple[str, str]], limit: int = PAGE_SIZE
) -> Iterator[MutableObj]:
    """Every DeviceTaintRule of ``version`` matching ``query``, page by page."""
    path = f"/apis/{GROUP}/{version}/{RESOURCE}"
    what = f"list {RESOURCE}" + "".join(f" ({value})" for key, value in query)
    for page in kube_api.pages(lambda q: api.get_json(what, path, q), query, limit):
        yield from (i for i in page.get("items") or [] if isinstance(i, dict))


class TaintRules:
    """List, create, replace and delete DeviceTaintRules in one discovered version."""

    def __init__(self, client: kube_api.ApiClient, version: str) -> None:
        if version not in VERSIONS:
            raise ValueError(f"not a DeviceTaintRule version: {version}")
        self.version = version
        self._api = kube_api.Api(client, async_patch=False)
        self._path = f"/apis/{GROUP}/{version}/{RESOURCE}"
        self.calls = 0

    def list(self, label_selector: str) -> builtins.list[MutableObj]:
        before = self._api.calls
        try:
            return list(list_pages(self._api, self.version, [("labelSelector", label_selector)]))
        finally:
            self.calls += self._api.calls - before

    def create(self, body: MutableObj) -> MutableObj:
        name = body["metadata"]["name"]
        return self._send(f"create DeviceTaintRule {name}", "POST", self._path, self._typed(body))

    def replace(self, body: MutableObj) -> MutableObj:
        """PUT with the body's resourceVersion: 409 if the rule changed meanwhile."""
        name = body["metadata"]["name"]
        return self._send(
            f"update DeviceTaintRule {name}", "PUT", self._named(name), self._typed(body)
        )

    def delete(self, name: str, uid: str, resource_version: str) -> None:
        """Delete exactly the object we listed (uid and resourceVersion preconditions)."""
        body = {"preconditions": {"uid": uid, "resourceVersion": resource_version}}
        self._send(f"delete DeviceTaintRule {name}", "DELETE", self._named(name), body, query=[])

    # Node events (the ClusterRole already grants events create and patch); their failures
    # are ``kube.CallError`` too (the event recorder only logs and counts them).

    def create_event(self, namespace: str, body: Any) -> MutableObj:
        self.calls += 1
        return self._api.create_event(namespace, body)

    def patch_event(self, namespace: str, name: str, body: MutableObj) -> MutableObj:
        self.calls += 1
        return self._api.patch_event(namespace, name, body)

    def _named(self, name: str) -> str:
        return f"{self._path}/{urllib.parse.quote(name, safe='')}"

    def _typed(self, body: MutableObj) -> MutableObj:
        return {"apiVersion": f"{GROUP}/{self.version}", "kind": "DeviceTaintRule", **body}

    def _send(
        self,
        what: str,
        method: str,
        path: str,
        body: MutableObj,
        *,
        query: builtins.list[tuple[str, str]] | None = None,
    ) -> MutableObj:
        self.calls += 1
        manager = [("fieldManager", kube_api.FIELD_MANAGER)]
        query = manager if query is None else query
        return self._api.send_json(what, method, path, query=query, body=body)

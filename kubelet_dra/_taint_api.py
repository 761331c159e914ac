"""Blocking DeviceTaintRule calls for the taint bridge, on plain JSON, errors translated.

Private half of ``taintbridge`` (the third module, after ``kube``'s halves, that imports
``kubernetes``). No kubelet counterpart. Like ``kube``'s calls it asks the official client
for the raw response (``_preload_content=False``), so a field the client's models do not
know survives.

:func:`discover` finds the newest served version of ``devicetaintrules`` in
``resource.k8s.io``: ``v1`` (GA in 1.37), else ``v1beta2``, else ``v1alpha3``. The three
versions have the same fields the bridge uses. Client exceptions become
:class:`TaintApiError` with the HTTP status (``None`` for a lost connection).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import kubernetes.client
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from kubelet_dra import errors
from kubelet_dra.kube import api as kube_api

Obj = dict[str, Any]
RESOURCE = "devicetaintrules"
GROUP = "resource.k8s.io"
FIELD_MANAGER = "kubelet-dra-health"
_TIMEOUT = (5.0, 30.0)
# Class names, resolved when the bridge is used: ``kubernetes.client`` imports each
# generated API module on first attribute access, and these cost import time and memory
# in every sidecar while the bridge is off (issue 15 measures both).
_VERSIONS: tuple[tuple[str, str], ...] = (
    ("v1", "ResourceV1Api"),
    ("v1beta2", "ResourceV1beta2Api"),
    ("v1alpha3", "ResourceV1alpha3Api"),
)
VERSIONS = tuple(version for version, _ in _VERSIONS)


class TaintApiError(errors.ApiError):
    """A DeviceTaintRule call failed; ``status`` is ``None`` when the connection was lost."""

    def __init__(self, message: str, *, status: int | None = None, reason: str = "") -> None:
        super().__init__(message, status=status)
        self.reason = reason

    @property
    def transient(self) -> bool:
        """Worth retrying: connection loss, 429 or 5xx."""
        return self.status is None or self.status == 429 or self.status >= 500


def discover(client: kubernetes.client.ApiClient) -> str | None:
    """The newest version serving ``devicetaintrules`` with the verbs we use, or ``None``.

    A version that is not served answers 404; a served version without the resource
    (``DRADeviceTaintRules`` off) lists other resources only.
    """
    for version, class_name in _VERSIONS:
        api = getattr(kubernetes.client, class_name)(client)

        def send(api: Any = api) -> Any:
            return api.get_api_resources(_preload_content=False, _request_timeout=_TIMEOUT)

        try:
            answer = _call(f"discover {GROUP}/{version}", send)
        except TaintApiError as exc:
            if exc.status == 404:
                continue
            raise
        names = {r.get("name") for r in answer.get("resources") or [] if isinstance(r, dict)}
        if RESOURCE in names:
            return version
    return None


class TaintApi:
    """List, create, replace and delete DeviceTaintRules in one discovered version."""

    def __init__(self, client: kubernetes.client.ApiClient, version: str) -> None:
        class_name = dict(_VERSIONS)[version]
        self.version = version
        self._api = getattr(kubernetes.client, class_name)(client)
        self._events = kube_api.Api(client)  # the Node events: the status writer's calls
        self.calls = 0

    def list(self, label_selector: str) -> list[Obj]:
        items: list[Obj] = []
        token: str | None = None
        while True:

            def send(token: str | None = token) -> Any:
                return self._api.list_device_taint_rule(
                    label_selector=label_selector, limit=500, _continue=token,
                    _preload_content=False, _request_timeout=_TIMEOUT,
                )  # fmt: skip

            page = self._call(f"list {RESOURCE} ({label_selector})", send)
            items.extend(i for i in page.get("items") or [] if isinstance(i, dict))
            token = (page.get("metadata") or {}).get("continue") or None
            if not token:
                return items

    def create(self, body: Obj) -> Obj:
        name = body["metadata"]["name"]
        return self._call(
            f"create DeviceTaintRule {name}",
            lambda: self._api.create_device_taint_rule(
                self._typed(body), field_manager=FIELD_MANAGER, _preload_content=False,
                _request_timeout=_TIMEOUT,
            ),
        )  # fmt: skip

    def replace(self, body: Obj) -> Obj:
        """PUT with the body's resourceVersion: 409 if the rule changed meanwhile."""
        name = body["metadata"]["name"]
        return self._call(
            f"update DeviceTaintRule {name}",
            lambda: self._api.replace_device_taint_rule(
                name, self._typed(body), field_manager=FIELD_MANAGER, _preload_content=False,
                _request_timeout=_TIMEOUT,
            ),
        )  # fmt: skip

    def delete(self, name: str, uid: str, resource_version: str) -> None:
        """Delete exactly the object we listed (uid and resourceVersion preconditions)."""
        body = {"preconditions": {"uid": uid, "resourceVersion": resource_version}}
        self._call(
            f"delete DeviceTaintRule {name}",
            lambda: self._api.delete_device_taint_rule(
                name, body=body, _preload_content=False, _request_timeout=_TIMEOUT
            ),
        )

    # Node events (the ClusterRole already grants events create and patch); their failures
    # are ``kube.CallError`` (the event recorder only logs and counts them).

    def create_event(self, namespace: str, body: Any) -> Obj:
        self.calls += 1
        return self._events.create_event(namespace, body)

    def patch_event(self, namespace: str, name: str, body: Obj) -> Obj:
        self.calls += 1
        return self._events.patch_event(namespace, name, body)

    def _typed(self, body: Obj) -> Any:
        return {"apiVersion": f"{GROUP}/{self.version}", "kind": "DeviceTaintRule", **body}

    def _call(self, what: str, send: Callable[[], Any]) -> Obj:
        self.calls += 1
        return _call(what, send)


def _call(what: str, send: Callable[[], Any]) -> Obj:
    try:
        response = send()
        data: Obj = json.loads(response.data or b"{}")
        return data
    except ApiException as exc:
        status = int(exc.status) if exc.status else None
        body = _body(exc)
        message = str(body.get("message") or exc.reason)
        raise TaintApiError(
            f"{what}: HTTP {status} {message}", status=status, reason=str(body.get("reason") or "")
        ) from exc
    except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
        raise TaintApiError(f"{what}: connection lost ({exc})") from exc


def _body(exc: ApiException) -> Obj:
    try:
        parsed = json.loads(exc.body or "{}")
    except (ValueError, TypeError):
        return {}
    return parsed if isinstance(parsed, dict) else {}

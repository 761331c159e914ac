"""Blocking calls to the Kubernetes API on plain JSON, errors translated.

The package's one API layer: the error translation (:func:`translate`), the call wrapper
(:class:`Api`) and the paging helper (:func:`pages`) that ``kube.taintrules`` and the
kubectl plugin use too. Every call asks the official client for the raw response and
decodes the JSON itself, so no ``V1Pod`` ever exists and fields the client's models do not
know survive untouched. :class:`Api` says how errors are translated and which are retried.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pathlib
import socket
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import kubernetes.client
import kubernetes.config
import urllib3.exceptions
import yaml
from kubernetes.client.exceptions import ApiException

from kubelet_dra import errors
from kubelet_dra.kube import asyncpatch
from kubelet_dra.status import podjson

logger = logging.getLogger(__name__)

T = TypeVar("T")
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
FIELD_MANAGER = "kubelet-dra-health"
_TIMEOUT = (5.0, 30.0)  # connect, read: a hung server must not hang a writer forever


class CallError(errors.ApiError):
    """An API call failed; ``status`` is ``None`` when the connection was lost."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        server_message: str = "",
    ) -> None:
        super().__init__(message, status=status)
        self.retry_after = retry_after
        # The Status object's ``message`` (else the body's text), for callers that word
        # their own line (the kubectl plugin); "" for a lost connection.
        self.server_message = server_message

    @property
    def transient(self) -> bool:
        """Worth retrying: connection loss, 429 or 5xx."""
        return self.status is None or self.status == 429 or self.status >= 500


def is_transient(exc: BaseException) -> bool:
    """The retry rule of every API call: a :class:`CallError` that is transient.

    ``errors.PodGone`` is never one (it is no ``CallError``): a gone pod is
    given up, not retried.
    """
    return isinstance(exc, CallError) and exc.transient


class Gone(CallError):
    """A watch's resourceVersion is too old (410): list again."""


ApiClient = kubernetes.client.ApiClient
"""The official client's ``ApiClient``: the type of every client handed to the library
(``DRAHealthManager(api_client=...)``), named here so no module outside ``kube/`` imports
``kubernetes`` to spell it."""


def load_client(kubeconfig: str | os.PathLike[str] | None = None) -> kubernetes.client.ApiClient:
    """A client from ``kubeconfig``, else in-cluster config, else ``~/.kube/config``.

    Every way a kubeconfig can be unusable (missing, unreadable, not YAML, not
    a kubeconfig) is an :class:`errors.ConfigError` with one readable line: the
    client library raises ``TypeError`` or ``KeyError`` for some malformed
    files, which would otherwise surface as a traceback and exit code 1.
    """
    if kubeconfig:
        return _client_from_file(pathlib.Path(kubeconfig))
    try:
        config = kubernetes.client.Configuration()
        kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=config
        )
    except (kubernetes.config.ConfigException, OSError):
        default = pathlib.Path.home() / ".kube" / "config"
        if not default.is_file():
            raise errors.ConfigError(
                "no kubeconfig: not in a cluster and ~/.kube/config does not exist"
            ) from None
        return _client_from_file(default)
    return _client(config)


def _client_from_file(path: pathlib.Path) -> kubernetes.client.ApiClient:
    if not path.is_file():
        raise errors.ConfigError(f"kubeconfig {path} is not a readable file")
    try:
        parsed = yaml.safe_load(path.read_bytes())
    except OSError as exc:
        raise errors.ConfigError(f"kubeconfig {path} cannot be read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise errors.ConfigError(f"kubeconfig {path} is not valid YAML") from exc
    if not isinstance(parsed, dict):
        raise errors.ConfigError(f"kubeconfig {path} is not a kubeconfig (not a YAML mapping)")
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(path), client_configuration=config
        )
    except (kubernetes.config.ConfigException, OSError) as exc:
        raise errors.ConfigError(f"cannot load Kubernetes credentials: {exc}") from exc
    except Exception as exc:
        raise errors.ConfigError(f"kubeconfig {path} is not a valid kubeconfig: {exc}") from exc
    return _client(config)


def _client(config: kubernetes.client.Configuration) -> kubernetes.client.ApiClient:
    # Our callers retry with backoff (tenacity, watch loops); urllib3's own three
    # immediate retries under them multiplied every attempt by four in an outage.
    config.retries = 0
    return kubernetes.client.ApiClient(config)


class Api:
    """The handful of calls a node's device-health reporter makes.

    Requests are built with the client's lower-level ``ApiClient``
    (``param_serialize`` + ``call_api``), not ``CoreV1Api``/``ResourceV1Api``:
    those generated modules (4.5 MB of source for the core group) cost about
    0.45 s to import and several MB of memory, and validate every argument
    with pydantic on each call, which a profile of the report -> PATCH path
    showed. Authentication, TLS, the proxy and the token refresh
    hook are still the client's.

    Client exceptions become :class:`CallError` (an ``errors.ApiError`` with the
    HTTP status, ``None`` for a lost connection, ``Retry-After`` when the server
    sent one, and the server's own message); a 404 on a pod becomes ``errors.PodGone``.
    Which failures are worth retrying is said once, by :func:`is_transient`. The callers in
    ``kube.pods`` and ``kube.writer`` run these through ``asyncio.to_thread``,
    except the pod status PATCH, which :meth:`Api.json_patch_pod_status_async`
    sends from the event loop (``kube.asyncpatch``) with the same errors.
    """

    def __init__(self, client: kubernetes.client.ApiClient, *, async_patch: bool = True) -> None:
        self.client = client
        self.calls = 0  # every request sent, watches included (the node-load test reads it)
        # The status PATCH's transport on the event loop; made at its first use
        # (``False``: not possible with this configuration, or switched off).
        self._transport: asyncpatch.Transport | bool | None = None if async_patch else False

    # -- pods ----------------------------------------------------------------

    def list_node_pods(self, node: str, *, limit: int = 0, token: str = "") -> dict[str, Any]:
        """The pods bound to ``node`` (field selector ``spec.nodeName``), as a list object.

        ``limit`` > 0 asks for one page of at most that many pods, the one after the
        ``continue`` ``token`` of the page before; the page's ``metadata.continue`` names
        the next (empty on the last). Every page is of the same snapshot, and the last
        one's ``resourceVersion`` is the list's. An expired token is ``Gone`` (410).
        """
        query = [_node_selector(node)]
        if limit > 0:
            query.append(("limit", str(limit)))
            if token:
                query.append(("continue", token))
        return podjson.lean(
            self._call(
                f"list pods on node {node}",
                lambda: self._request("GET", "/api/v1/pods", query=query),
            )
        )

    def watch_node_pods(
        self, node: str, resource_version: str, *, timeout: int, on_open: Callable[[Any], None]
    ) -> Iterator[dict[str, Any]]:
        """Events of the node's pods after ``resource_version`` (bookmarks included)."""
        query = [
            _node_selector(node), ("watch", "true"), ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(timeout)),
        ]  # fmt: skip
        events = self._watch(
            f"watch pods on node {node}",
            "/api/v1/pods",
            query,
            (_TIMEOUT[0], timeout + 30),
            on_open,
        )
        for event in events:
            if isinstance(event.get("object"), dict):
                podjson.lean(event["object"])
            yield event

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """One pod, read through ``pods/<name>/status``; 404 is ``errors.PodGone``."""
        return podjson.lean(
            self._call(
                f"get pod {namespace}/{name}",
                lambda: self._request("GET", _path("api/v1", namespace, "pods", name, "status")),
                pod=True,
            )
        )

    def json_patch_pod_status(
        self, namespace: str, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """A JSON patch (RFC 6902, with ``test`` operations) of ``pods/<name>/status``."""
        return podjson.lean(
            self._call(
                f"patch status of pod {namespace}/{name}",
                lambda: self._request(
                    "PATCH", _path("api/v1", namespace, "pods", name, "status"),
                    query=[("fieldManager", FIELD_MANAGER)], body=ops, content_type=JSON_PATCH,
                ),
                pod=True,
            )
        )  # fmt: skip

    async def json_patch_pod_status_async(
        self, namespace: str, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """:meth:`json_patch_pod_status` sent from the event loop, same answers and errors.

        Falls back to the official client in a worker thread when the
        configuration needs it (a proxy, socket options).
        """
        transport = self._async_transport()
        if transport is None:
            return await asyncio.to_thread(self.json_patch_pod_status, namespace, name, ops)
        what = f"patch status of pod {namespace}/{name}"
        self.calls += 1
        body = json.dumps(ops).encode()  # json.dumps' defaults, as the official client's
        try:
            answer = await transport.request(
                "PATCH", _path("api/v1", namespace, "pods", name, "status"), _PATCH_QUERY,
                body, JSON_PATCH,
            )  # fmt: skip
        except asyncpatch.TransportError as exc:
            errors.drop_frames(exc)  # the transport's frames hold the stream that holds it
            raise CallError(f"{what}: connection lost ({exc})") from exc
        if not 200 <= answer.status <= 299:
            raise _error(what, answer.status, answer.reason, answer.body, answer.headers, pod=True)
        try:
            data: dict[str, Any] = json.loads(answer.body or b"{}")
        except ValueError as exc:
            raise CallError(f"{what}: connection lost ({exc})") from exc
        return podjson.lean(data)

    async def aclose(self) -> None:
        """Close the event loop transport's idle connections (a later call opens new ones)."""
        if isinstance(self._transport, asyncpatch.Transport):
            await self._transport.aclose()

    def patch_pool(self) -> asyncpatch.PoolCounts | None:
        """The event loop transport's connections; zeros before the first PATCH, ``None``
        when the PATCHes go through the official client (a proxy, socket options)."""
        if self._transport is False:
            return None
        if isinstance(self._transport, asyncpatch.Transport):
            return self._transport.counts()
        return asyncpatch.PoolCounts()

    def _async_transport(self) -> asyncpatch.Transport | None:
        if self._transport is None:
            made = asyncpatch.Transport.from_client(self.client, timeout=_TIMEOUT)
            self._transport = made if made is not None else False
        return self._transport if isinstance(self._transport, asyncpatch.Transport) else None

    # -- claims --------------------------------------------------------------

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """One ``resource.k8s.io/v1`` ResourceClaim."""
        return self._call(
            f"get ResourceClaim {namespace}/{name}",
            lambda: self._request(
                "GET", _path("apis/resource.k8s.io/v1", namespace, "resourceclaims", name)
            ),
        )

    # -- events --------------------------------------------------------------

    def create_event(self, namespace: str, body: Any) -> dict[str, Any]:
        """Create a core/v1 Event in ``namespace``."""
        return self._call(
            f"create event in {namespace}",
            lambda: self._request(
                "POST", _path("api/v1", namespace, "events"), body=body,
                content_type="application/json",
            ),
        )  # fmt: skip

    def patch_event(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Update an Event's count, message and time (a JSON merge patch)."""
        return self._call(
            f"update event {namespace}/{name}",
            lambda: self._request(
                "PATCH", _path("api/v1", namespace, "events", name), body=body,
                content_type=MERGE,
            ),
        )  # fmt: skip

    # -- any resource ----------------------------------------------------------

    def get_json(
        self,
        what: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        *,
        timeout: tuple[float, float] = _TIMEOUT,
    ) -> dict[str, Any]:
        """GET ``path`` as JSON, errors translated (``kube.taintrules``, the kubectl plugin)."""
        return self._call(what, lambda: self._request("GET", path, query=query, timeout=timeout))

    def send_json(
        self,
        what: str,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """Any other verb on ``path`` with a JSON body, errors translated."""
        return self._call(
            what,
            lambda: self._request(method, path, query=query, body=body, content_type=content_type),
        )

    def open_stream(
        self, what: str, path: str, query: list[tuple[str, str]], *, timeout: tuple[float, float]
    ) -> Any:
        """A GET whose raw response the caller reads (a watch); release it when done."""
        self.calls += 1
        try:
            return self._request("GET", path, query=query, timeout=timeout)
        except ApiException as exc:
            errors.drop_frames(exc)
            raise translate(what, exc) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            errors.drop_frames(exc)
            raise CallError(f"{what}: connection lost ({exc})") from exc

    # -- requests ------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: tuple[float, float] = _TIMEOUT,
    ) -> Any:
        """Send one request; the raw urllib3 response, or ``ApiException`` for non-2xx
        (what ``CoreV1Api`` does with ``_preload_content=False``)."""
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        request = self.client.param_serialize(
            method=method, resource_path=path, query_params=query or [],
            header_params=headers, body=body, auth_settings=["BearerToken"],
        )  # fmt: skip
        response = self.client.call_api(*request, _request_timeout=timeout)
        if not 200 <= response.status <= 299:
            response.read()  # type: ignore[no-untyped-call]
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return response.response

    # -- internals -----------------------------------------------------------

    def _call(self, what: str, send: Callable[[], Any], *, pod: bool = False) -> dict[str, Any]:
        self.calls += 1
        try:
            response = send()
            data: dict[str, Any] = json.loads(response.data or b"{}")
            return data
        except ApiException as exc:
            errors.drop_frames(exc)
            raise translate(what, exc, pod=pod) from exc
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            errors.drop_frames(exc)
            raise CallError(f"{what}: connection lost ({exc})") from exc

    def _watch(
        self,
        what: str,
        path: str,
        query: list[tuple[str, str]],
        timeout: tuple[float, float],
        on_open: Callable[[Any], None],
    ) -> Iterator[dict[str, Any]]:
        response = self.open_stream(what, path, query, timeout=timeout)
        on_open(response)
        try:
            yield from _events(what, response)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            errors.drop_frames(exc)
            raise CallError(f"{what}: connection lost ({exc})") from exc
        finally:
            response.release_conn()


def _path(prefix: str, namespace: str, resource: str, *rest: str) -> str:
    """``/<prefix>/namespaces/<ns>/<resource>[/<name>[/<sub>]]``, each segment quoted."""
    parts = [namespace, resource, *rest]
    return f"/{prefix}/namespaces/" + "/".join(urllib.parse.quote(p, safe="") for p in parts)


_PATCH_QUERY = urllib.parse.urlencode([("fieldManager", FIELD_MANAGER)])


def _node_selector(node: str) -> tuple[str, str]:
    return ("fieldSelector", f"spec.nodeName={node}")


def close_response(response: Any) -> None:
    """Unblock a thread reading a watch (called from another thread on shutdown)."""
    try:
        sock = getattr(getattr(response, "connection", None), "sock", None)
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
        response.close()
    except (OSError, AttributeError):
        logger.debug("closing a watch failed", exc_info=True)


def _events(what: str, response: Any) -> Iterator[dict[str, Any]]:
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=True):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield _event(what, line)
    if buffer.strip():
        yield _event(what, buffer)


def _event(what: str, line: bytes) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(line)
    if event.get("type") == "ERROR":
        obj = event.get("object") or {}
        code = obj.get("code")
        cls = Gone if code == 410 else CallError
        raise cls(f"{what}: {obj.get('reason')}: {obj.get('message')}", status=code)
    return event


def pages(
    get: Callable[[list[tuple[str, str]]], dict[str, Any]],
    query: list[tuple[str, str]],
    limit: int,
) -> Iterator[dict[str, Any]]:
    """A list's pages, ``limit`` items each, following ``metadata.continue`` to the end.

    ``get(query)`` fetches one page; the last page's ``metadata`` carries the list's
    ``resourceVersion``.
    """
    token = ""
    while True:
        page_query = [*query, ("limit", str(limit))]
        page = get([*page_query, ("continue", token)] if token else page_query)
        yield page
        token = str((page.get("metadata") or {}).get("continue") or "")
        if not token:
            return


def translate(what: str, exc: ApiException, *, pod: bool = False) -> errors.ApiError:
    """The one translation of the official client's ``ApiException`` (status 0: no answer)."""
    status = int(exc.status) if exc.status else None
    return _error(what, status, exc.reason, exc.body, exc.headers, pod=pod)


def _error(
    what: str,
    status: int | None,
    reason: object,
    body: str | bytes | None,
    headers: Any,
    *,
    pod: bool = False,
) -> errors.ApiError:
    """The error for a non-2xx answer, whichever transport brought it."""
    said = _server_message(body)
    message = f"{what}: HTTP {status} {said if said is not None else reason}"
    if pod and status == 404:
        return errors.PodGone(message, status=404)
    if status == 410:
        return Gone(message, status=410, server_message=said or "")
    return CallError(
        message, status=status, retry_after=_retry_after(headers), server_message=_text(body, said)
    )


def _server_message(body: str | bytes | None) -> str | None:
    """The Status object's ``message``; ``None`` if the body has none (or is no JSON)."""
    try:
        message = json.loads(body or "{}").get("message")
    except (ValueError, AttributeError):
        return None
    return str(message) if message else None


def _text(body: str | bytes | None, said: str | None) -> str:
    if said is not None:
        return said
    try:
        json.loads(body or "{}")
    except ValueError:
        raw = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
        return raw.strip()[:200]
    return ""


def _retry_after(headers: Any) -> float | None:
    headers = headers or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None

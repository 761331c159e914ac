"""HTTP front end of the fake API server: routing, JSON answers and chunked watch streams.

Mimics the kube-apiserver's REST surface as the official ``kubernetes`` Python client uses it:
``/api/v1`` and ``/apis/<group>/<version>`` paths, ``Status`` error bodies, lists with a
``metadata.resourceVersion``, and watches answered as HTTP/1.1 chunked JSON lines
(``{"type": ..., "object": ...}``) with ADDED/MODIFIED/DELETED/BOOKMARK/ERROR events, as the
apiserver's watch cache sends them.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import logging
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubelet_dra.testing.fakeapi import _faults as faultlib
from kubelet_dra.testing.fakeapi import _generic as generic
from kubelet_dra.testing.fakeapi import _ops as ops
from kubelet_dra.testing.fakeapi import _status as status
from kubelet_dra.testing.fakeapi import _store as storage
from kubelet_dra.testing.fakeapi import _watch as watching

logger = logging.getLogger(__name__)

_VERSION = {"major": "1", "minor": "36", "gitVersion": "v1.36.0-fakeapi", "platform": "linux/amd64"}


@dataclass
class Context:
    """What every request handler shares; owned by ``FakeApiServer``."""

    backend: ops.Backend
    faults: faultlib.Faults
    log: faultlib.RequestLog
    token: str | None
    bookmark_interval: float
    max_watch_seconds: float | None
    stopped: threading.Event = field(default_factory=threading.Event)
    #: What is served where (built-in types, DeviceTaintRule versions, a test's own types).
    types: generic.Types = field(default_factory=generic.Types)


@dataclass(frozen=True)
class Route:
    resource: storage.Resource
    namespace: str | None
    name: str | None
    subresource: str | None


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, context: Context) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.context = context

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a request's exception to stderr; a client that goes away
        # mid-request (a process stopping, a test's dropped connection) is routine for a
        # stand-in. Log it instead, where the caller routes logs (the demo: a file).
        logger.debug("request from %s failed", client_address, exc_info=True)


def parse_route(path: str, types: generic.Types) -> Route | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group_version, rest = parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not 1 <= len(rest) <= 3:
        return None
    resource = types.lookup(group_version, rest[0])
    if resource is None or (namespace is not None and not resource.namespaced):
        return None
    if not resource.namespaced:
        namespace = ""  # cluster-scoped objects are stored under namespace ""
    name = rest[1] if len(rest) > 1 else None
    return Route(resource, namespace, name, rest[2] if len(rest) > 2 else None)


class Handler(BaseHTTPRequestHandler):
    """One connection; HTTP/1.1 keep-alive like the real server."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, each answer
    # waits ~40 ms for the client's delayed ACK (a real apiserver does not).
    disable_nagle_algorithm = True
    server: Server
    _lose = False  # this request's answer is to be lost (a "lose" fault)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log replaces stderr access logs

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # request plumbing

    def _handle(self, method: str) -> None:
        ctx = self.server.context
        url = urlsplit(self.path)
        self._method, self._url_path = method, url.path
        self._query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip() or None
        self._body, body_error = _parse_json(raw)
        watch = self._query.get("watch") in ("true", "1")
        delay, rule = ctx.faults.take(method, url.path, watch)
        if delay:
            time.sleep(delay)
        if rule is not None and rule.action == "drop":
            self._drop()
            return
        # "lose": the request is carried out, then the connection closes unanswered.
        self._lose = rule is not None and rule.action == "lose"
        try:
            if rule is not None and not self._lose:
                raise rule.error()
            self._authenticate()
            if body_error is not None:
                raise status.bad_request(body_error)
            self._dispatch(method, watch)
        except status.ApiError as err:
            self._send(err.code, err.status, err.headers)

    def _record(self, code: int, answer: Any = None, *, lost: bool = False) -> None:
        stored = None
        if code < 300 and self._method in ("PUT", "PATCH") and self._url_path.endswith("/status"):
            # A copy: the answer may be the stored object, which later writes change.
            stored = copy.deepcopy(answer)
        self.server.context.log.add(
            faultlib.RequestRecord(
                method=self._method,
                path=self._url_path,
                query=dict(self._query),
                content_type=self._content_type,
                body=self._body,
                status=code,
                timestamp=time.time(),
                stored=stored,
                lost=lost,
            )
        )

    def _drop(self) -> None:
        self._record(0)
        self._disconnect()

    def _disconnect(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _authenticate(self) -> None:
        token = self.server.context.token
        if token and self.headers.get("Authorization") != f"Bearer {token}":
            raise status.ApiError(status.status_body(401, "Unauthorized", "Unauthorized"))

    def _send(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        if self._lose:
            self._record(code, body, lost=True)
            self._disconnect()
            return
        self._record(code, body)
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    # verbs

    def _dispatch(self, method: str, watch: bool) -> None:
        if method == "GET" and self._url_path.rstrip("/") == "/version":
            self._send(200, _VERSION)
            return
        types = self.server.context.types
        if method == "GET" and (doc := types.discovery(self._url_path)):
            self._send(200, doc)
            return
        route = parse_route(self._url_path, types)
        if (
            route is None
            or route.subresource not in (None, "status")
            or (route.subresource == "status" and not route.resource.has_status)
        ):
            raise status.ApiError(
                status.status_body(
                    404, "NotFound", "the server could not find the requested resource", {}
                )
            )
        if route.name is None:
            self._collection(method, route, watch)
        else:
            self._member(method, route)

    def _collection(self, method: str, route: Route, watch: bool) -> None:
        backend = self.server.context.backend
        if method == "GET" and watch:
            self._watch(route)
        elif method == "GET":
            self._send(200, self._list(route))
        elif method == "POST" and route.namespace is not None:
            self._send(201, backend.create(route.resource, route.namespace, self._body))
        else:
            raise _method_not_allowed(method)

    def _member(self, method: str, route: Route) -> None:
        backend, ns, name = self.server.context.backend, route.namespace, route.name
        res, sub = route.resource, route.subresource
        if ns is None or name is None:
            raise _method_not_allowed(method)
        if method == "GET":
            self._send(200, backend.store.get(res, ns, name))
        elif method == "PUT":
            self._send(200, backend.replace(res, ns, name, self._body, subresource=sub))
        elif method == "PATCH":
            patched = backend.patch(
                res, ns, name, self._body, subresource=sub, content_type=self._content_type or ""
            )
            self._send(200, patched)
        elif method == "DELETE" and sub is None:
            self._send(200, _deleted_answer(res, backend.delete(res, ns, name, self._body)))
        else:
            raise _method_not_allowed(method)

    def _list(self, route: Route) -> dict[str, Any]:
        res = route.resource
        selector = storage.Selector(
            res, self._query.get("fieldSelector", ""), self._query.get("labelSelector", "")
        )
        items, meta = list_page(
            self.server.context.backend.store, res, route.namespace, selector, self._query
        )
        for item in items:  # list items carry no kind/apiVersion, like the real server
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": meta,
            "items": items,
        }

    def _watch(self, route: Route) -> None:
        ctx = self.server.context
        stream = watching.WatchStream(
            ctx.backend.store,
            route.resource,
            route.namespace,
            storage.Selector(
                route.resource,
                self._query.get("fieldSelector", ""),
                self._query.get("labelSelector", ""),
            ),
            query=self._query,
            bookmark_interval=ctx.bookmark_interval,
            max_seconds=ctx.max_watch_seconds,
            stopped=ctx.stopped,
        )
        self._record(200)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for line in stream.lines(self._client_gone):
                self._chunk(line)
            self._chunk(b"")
        except OSError:
            self.close_connection = True  # the client went away mid-stream

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _client_gone(self) -> bool:
        # A keep-alive client sends nothing while it waits for the answer; readable means EOF.
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return bool(self.connection.recv(1, socket.MSG_PEEK) == b"")
        except OSError:
            return True


def _parse_json(raw: bytes) -> tuple[Any, str | None]:
    if not raw:
        return None, None
    try:
        return json.loads(raw), None
    except ValueError as err:
        return None, f"error decoding request body: {err}"


def _method_not_allowed(method: str) -> status.ApiError:
    return status.ApiError(
        status.status_body(
            405,
            "MethodNotAllowed",
            f"the server does not allow this method on the requested resource ({method})",
            {},
        )
    )


def _deleted_answer(res: storage.Resource, obj: dict[str, Any]) -> dict[str, Any]:
    if res.has_status:
        return obj  # pods and claims answer the deleted object
    meta = obj["metadata"]
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": meta["name"], "kind": res.plural, "uid": meta["uid"]},
    }


def list_page(
    store: storage.Store,
    res: storage.Resource,
    namespace: str | None,
    selector: storage.Selector,
    query: dict[str, str],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """limit/continue paging; the token names the last key returned."""
    token = query.get("continue")
    start: tuple[str, str] | None = None
    if token:
        try:
            raw = json.loads(base64.urlsafe_b64decode(token.encode()))["start"]
            start = (str(raw[0]), str(raw[1]))
        except (ValueError, KeyError, TypeError, IndexError) as err:
            raise status.bad_request(f"continue key is not valid: {err}") from err
    try:
        limit = int(query.get("limit") or 0)
    except ValueError as err:
        raise status.bad_request(f"invalid limit: {err}") from err
    items, remaining, rv = store.select_page(res, namespace, selector, after=start, limit=limit)
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if remaining:
        last = json.dumps({"rv": rv, "start": _key(items[-1])}).encode()
        meta["continue"] = base64.urlsafe_b64encode(last).decode()
        meta["remainingItemCount"] = remaining
    return items, meta


def _key(item: dict[str, Any]) -> tuple[str, str]:
    return item["metadata"].get("namespace", ""), item["metadata"]["name"]

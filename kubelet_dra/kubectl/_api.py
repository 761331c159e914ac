"""Read-only calls of ``kubectl dra-health`` on plain JSON through the official client.

Every request goes through ``kube.api.Api`` (the package's one API layer, so the client's
authentication, TLS and proxy settings apply, and one error translation) and the body is
decoded with ``json``, so no model object is built. Only GET is ever sent. :class:`Reader`
says how pods are paged and which errors leave only columns empty.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

import kubernetes.client
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from kubelet_dra.kube import api as kube_api
from kubelet_dra.kube import taintrules
from kubelet_dra.status import podjson
from kubelet_dra.status.claims import ClaimKey
from kubelet_dra.status.podjson import MutableObj

logger = logging.getLogger(__name__)

T = TypeVar("T")
PAGE_SIZE = 500
TIMEOUT = (10.0, 60.0)  # connect, read
#: Above this many claims, one paged list of claims replaces the GETs: thousands of GETs cost
#: the client more than decoding every claim of the namespace (or cluster) once.
CLAIM_GET_LIMIT = 2000
_GET_THREADS = 8
_RETRYABLE = (urllib3.exceptions.HTTPError, OSError)


class ToolError(Exception):
    """A failure the command reports as one line and exit status 1."""


class ClaimFetcher(Generic[T]):
    """Reads claims while the pod list goes on, keeping ``convert(claim)`` of each.

    Claims are fetched as pods name them (:meth:`want`): a GET each, on a few threads, so they
    overlap the next pod pages. Once more than ``get_limit`` claims are wanted, the GETs not
    started are dropped for one paged list of the namespace's (or every) claims, which costs
    less than thousands of GETs.
    """

    def __init__(
        self,
        reader: Reader,
        namespace: str | None,
        convert: Callable[[MutableObj], T],
        *,
        get_limit: int = CLAIM_GET_LIMIT,
    ) -> None:
        self._reader, self._namespace, self._convert = reader, namespace, convert
        self._limit = get_limit
        self._pool = ThreadPoolExecutor(_GET_THREADS, thread_name_prefix="claims")
        self._wanted: set[ClaimKey] = set()
        self._gets: dict[ClaimKey, Future[T | None]] = {}
        self._listing: Future[dict[ClaimKey, T]] | None = None

    def __enter__(self) -> ClaimFetcher[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    @property
    def wanted(self) -> frozenset[ClaimKey]:
        return frozenset(self._wanted)

    def want(self, keys: Iterable[ClaimKey]) -> None:
        for key in keys:
            if key in self._wanted:
                continue
            self._wanted.add(key)
            if self._listing is not None:
                continue
            if len(self._wanted) > self._limit:
                for future in self._gets.values():
                    future.cancel()
                self._listing = self._pool.submit(self._list)
            else:
                self._gets[key] = self._pool.submit(self._get, key)

    def results(self) -> dict[ClaimKey, T]:
        """Every wanted claim that exists; raises what a read raised."""
        found: dict[ClaimKey, T] = {}
        if self._listing is not None:
            listed = self._listing.result()
            found.update((k, listed[k]) for k in self._wanted if k in listed)
        for key, future in self._gets.items():
            if key not in found and not future.cancelled():
                value = future.result()
                if value is not None:
                    found[key] = value
        return found

    def _get(self, key: ClaimKey) -> T | None:
        claim = self._reader.claim(key)
        return None if claim is None else self._convert(claim)

    def _list(self) -> dict[ClaimKey, T]:
        # The scope of the pod list, not of the claims wanted so far: more pods are coming.
        found: dict[ClaimKey, T] = {}
        for item in self._reader.claim_list(self._namespace):
            meta = podjson.metadata(item)
            key = ClaimKey(str(meta.get("namespace") or ""), podjson.name(item))
            found[key] = self._convert(item)
        return found


class HttpError(ToolError):
    """The server answered with an error ``status``."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class NotFound(HttpError):
    pass


class Reader:
    """GETs against one API server.

    Pods are listed in pages of ``limit`` items (kubectl's chunk size, 500)
    following ``continue`` (``kube.api.pages``), with the field selector the command asks for;
    the DeviceTaintRule version is the one ``kube.taintrules.discover_with`` finds.

    Errors (``kube.CallError``) become :class:`ToolError`, a one-line message: an unreachable
    server, 401, 403 and any other answer the command cannot do without. :meth:`Reader.claim`
    answers ``None`` for a claim that is gone, and :meth:`Reader.taint_rules` ``None`` when no
    DeviceTaintRule version is served or reading them is forbidden: both only leave columns empty.
    """

    def __init__(self, client: kubernetes.client.ApiClient, *, page_size: int = PAGE_SIZE) -> None:
        self._client = client
        self._api = kube_api.Api(client, async_patch=False)
        self.page_size = page_size

    @property
    def host(self) -> str:
        return str(self._client.configuration.host)

    # -- pods ------------------------------------------------------------------------------

    def pod_pages(
        self, namespace: str | None, field_selector: str, out: dict[str, str] | None = None
    ) -> Iterator[list[MutableObj]]:
        """Pods page by page; ``out["resourceVersion"]`` is the list's version at the end."""
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        return self._pages(path, field_selector, out)

    def pod(self, namespace: str, name: str) -> MutableObj:
        try:
            return self.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except NotFound:
            raise ToolError(f'pod "{name}" not found in namespace "{namespace}"') from None

    def watch_pods(
        self,
        namespace: str | None,
        field_selector: str,
        resource_version: str,
        timeout_seconds: int,
    ) -> Iterator[tuple[str, MutableObj]]:
        """Watch events (type, object) from ``resource_version`` until the server ends it."""
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if field_selector:
            query.append(("fieldSelector", field_selector))
        try:
            response = self._api.open_stream(
                f"GET {path}", path, query, timeout=(TIMEOUT[0], timeout_seconds + 30.0)
            )
        except kube_api.CallError as exc:
            raise self._tool_error(path, exc) from exc
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if line:
                    event = json.loads(line)
                    yield str(event.get("type", "")), event.get("object") or {}
        except _RETRYABLE as exc:
            raise ToolError(f"watch of pods on {self.host} broke: {_reason(exc)}") from exc
        finally:
            response.release_conn()

    # -- claims ----------------------------------------------------------------------------

    def claim(self, key: ClaimKey) -> MutableObj | None:
        path = f"/apis/resource.k8s.io/v1/namespaces/{key.namespace}/resourceclaims/{key.name}"
        try:
            return self.get(path)
        except NotFound:
            return None

    def claims(self, keys: Iterable[ClaimKey], namespace: str | None) -> dict[ClaimKey, MutableObj]:
        """The claims named (those that exist): a GET each, or one paged list when many."""
        fetcher: ClaimFetcher[MutableObj] = ClaimFetcher(self, namespace, lambda claim: claim)
        with fetcher:
            fetcher.want(keys)
            return fetcher.results()

    def claim_list(self, namespace: str | None) -> Iterator[MutableObj]:
        if namespace:
            return self._list_all(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims")
        return self._list_all("/apis/resource.k8s.io/v1/resourceclaims")

    # -- taints and events -------------------------------------------------------------------

    def taint_rules(self) -> list[MutableObj] | None:
        """DeviceTaintRules of the newest served version; ``None`` if none or forbidden."""
        try:
            try:
                version = taintrules.discover_with(self._api)
            except kube_api.CallError as exc:
                raise self._tool_error(f"/apis/{taintrules.GROUP}", exc) from exc
            if version is None:
                return None
            return list(self._list_all(f"/apis/{taintrules.GROUP}/{version}/{taintrules.RESOURCE}"))
        except NotFound:
            return None
        except HttpError as exc:
            if exc.status == 403:
                logger.info("DeviceTaintRules not shown: %s", exc)
                return None
            raise

    def pod_events(self, namespace: str, name: str, uid: str) -> list[MutableObj]:
        selector = f"involvedObject.kind=Pod,involvedObject.name={name}"
        found = self._list_all(f"/api/v1/namespaces/{namespace}/events", selector)
        return [
            e
            for e in found
            if not uid or podjson.child(e, "involvedObject").get("uid") in (None, "", uid)
        ]

    # -- plumbing ----------------------------------------------------------------------------

    def _list_all(self, path: str, field_selector: str = "") -> Iterator[MutableObj]:
        for items in self._pages(path, field_selector):
            yield from items

    def _pages(
        self, path: str, field_selector: str = "", out: dict[str, str] | None = None
    ) -> Iterator[list[MutableObj]]:
        """A list page by page (``limit``/``continue``); ``out`` gets its final version."""
        query = [("fieldSelector", field_selector)] if field_selector else []
        meta: MutableObj = {}
        for page in kube_api.pages(lambda q: self.get(path, q), query, self.page_size):
            meta = page.get("metadata") or {}
            yield list(page.get("items") or ())
        if out is not None:
            out["resourceVersion"] = str(meta.get("resourceVersion") or "")

    def get(self, path: str, query: Sequence[tuple[str, str]] = ()) -> MutableObj:
        try:
            body: object = self._api.get_json(f"GET {path}", path, list(query), timeout=TIMEOUT)
        except kube_api.CallError as exc:
            raise self._tool_error(path, exc) from exc
        if not isinstance(body, dict):
            raise ToolError(f"GET {path}: the answer is not a JSON object")
        return body

    def _tool_error(self, path: str, exc: kube_api.CallError) -> ToolError:
        """The command's line for a failed call (the API layer's error, worded for a user)."""
        if exc.status is not None:
            return _http_error(path, exc.status, exc.server_message)
        cause = exc.__cause__
        if isinstance(cause, ValueError):
            return ToolError(f"GET {path}: the answer is not JSON: {cause}")
        if isinstance(cause, ApiException):  # TLS failures surface here with status 0
            return ToolError(f"cannot reach the API server at {self.host}: {cause.reason}")
        return ToolError(f"cannot reach the API server at {self.host}: {_reason(cause or exc)}")


def _http_error(path: str, status: int, message: str) -> ToolError:
    if status == 404:
        return NotFound(message or f"GET {path}: not found", status)
    if status == 401:
        return HttpError("the API server rejected our credentials (401 Unauthorized)", status)
    if status == 403:
        return HttpError(f"forbidden: {message or 'GET ' + path}", status)
    return HttpError(f"GET {path}: {status} {message}".rstrip(), status)


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or exc
    text = str(reason)
    # urllib3 wraps the socket error: keep its last, human part.
    return text.rsplit(": ", 1)[-1] if "Errno" in text or "Failed to" in text else text

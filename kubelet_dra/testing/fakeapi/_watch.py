"""One watch request of the fake API server, as a generator of JSON event lines.

Mimics the kube-apiserver watch cache's ``cacheWatcher``: synthetic ADDED events for the current
state when the watch starts without a resourceVersion (or with "0", or with
``sendInitialEvents``), then the stored changes after the requested resourceVersion, filtered by
namespace and selectors. An object that stops matching a field selector is sent as DELETED (its
previous state, at the new resourceVersion), one that starts matching as ADDED. BOOKMARK events
carry only ``metadata.resourceVersion``. A resourceVersion older than the retained history gives
one ERROR event with a 410 Expired ``Status``, and the stream ends at ``timeoutSeconds``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubelet_dra.testing.fakeapi import _status as status
from kubelet_dra.testing.fakeapi import _store as storage

DEFAULT_TIMEOUT = 1800.0  # the apiserver's --min-request-timeout
_POLL = 0.2  # how often an idle watch checks whether its client is still there
_INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def event_line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"


class WatchStream:
    """State of one watch; construct it (may raise 400) before sending any header."""

    def __init__(
        self,
        store: storage.Store,
        resource: storage.Resource,
        namespace: str | None,
        selector: storage.Selector,
        *,
        query: dict[str, str],
        bookmark_interval: float,
        max_seconds: float | None,
        stopped: threading.Event,
    ) -> None:
        self._store, self._res, self._ns, self._selector = store, resource, namespace, selector
        self._rv_param = query.get("resourceVersion", "")
        if self._rv_param not in ("", "0") and not self._rv_param.isdigit():
            raise status.bad_request(f"invalid resource version: {self._rv_param}")
        self._send_initial = query.get("sendInitialEvents") == "true"
        self._initial = self._rv_param in ("", "0") or self._send_initial
        self._bookmarks = query.get("allowWatchBookmarks") == "true"
        timeout = float(query.get("timeoutSeconds") or DEFAULT_TIMEOUT)
        if max_seconds is not None:
            timeout = min(timeout, max_seconds)
        self._deadline = time.monotonic() + timeout
        self._interval = bookmark_interval
        self._next_bookmark = time.monotonic() + bookmark_interval
        self._stopped = stopped
        self._generation = store.generation
        self._bookmark_epoch = store.bookmark_epoch
        self._last_rv = 0

    def lines(self, client_gone: Callable[[], bool]) -> Iterator[bytes]:
        """Event lines until timeout, server stop, expiry or the client leaving."""
        batch, done = self._start()
        yield from batch
        while not done:
            batch, done = self._next()
            yield from batch
            if not done and not batch and client_gone():
                return

    def _start(self) -> tuple[list[bytes], bool]:
        with self._store.cond:
            self._generation = self._store.generation
            if not self._initial:
                self._last_rv = int(self._rv_param)
                return [], False
            self._last_rv = self._store.rv
            snapshot = self._store.snapshot(self._res, self._ns, self._selector)
            lines = [event_line("ADDED", obj) for obj in snapshot]
            if self._bookmarks and self._send_initial:
                # The streaming-list protocol: a bookmark marks the end of the initial state.
                lines.append(self._bookmark({_INITIAL_EVENTS_END: "true"}))
            return lines, False

    def _next(self) -> tuple[list[bytes], bool]:
        with self._store.cond:
            batch, done = self._collect()
            if batch or done:
                return batch, done
            wait = min(_POLL, max(0.0, self._deadline - time.monotonic()))
            if self._bookmarks:
                wait = min(wait, max(0.0, self._next_bookmark - time.monotonic()))
            self._store.cond.wait(timeout=wait)
            return self._collect()

    def _collect(self) -> tuple[list[bytes], bool]:
        """Caller holds the store's condition."""
        store = self._store
        if self._stopped.is_set() or store.generation != self._generation:
            return [], True
        try:
            changes = store.changes_after(self._res, self._last_rv)
        except storage.Expired as err:
            return [event_line("ERROR", status.status_body(410, "Expired", str(err)))], True
        self._last_rv = max(self._last_rv, store.rv)
        lines = [line for c in changes if (line := self._line(c)) is not None]
        if lines:
            return lines, False
        if time.monotonic() >= self._deadline:
            return [], True
        if self._bookmarks and self._bookmark_due():
            return [self._bookmark(None)], False
        return [], False

    def _bookmark_due(self) -> bool:
        now = time.monotonic()
        if now >= self._next_bookmark or self._store.bookmark_epoch != self._bookmark_epoch:
            self._bookmark_epoch = self._store.bookmark_epoch
            self._next_bookmark = now + self._interval
            return True
        return False

    def _bookmark(self, annotations: dict[str, str] | None) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": str(self._last_rv)}
        if annotations:
            meta["annotations"] = annotations
        obj = {"kind": self._res.kind, "apiVersion": self._res.api_version, "metadata": meta}
        return event_line("BOOKMARK", obj)

    def _matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        in_ns = self._ns is None or obj["metadata"].get("namespace", "") == self._ns
        return in_ns and self._selector.matches(obj)

    def _line(self, change: storage.Change) -> bytes | None:
        now_ok = self._matches(change.obj)
        if change.type == "ADDED":
            return event_line("ADDED", change.obj) if now_ok else None
        if change.type == "DELETED":
            return event_line("DELETED", change.obj) if now_ok else None
        was_ok = self._matches(change.prev)
        if now_ok:
            return event_line("MODIFIED" if was_ok else "ADDED", change.obj)
        if was_ok and change.prev is not None:
            gone = dict(change.prev)
            gone["metadata"] = dict(change.prev["metadata"], resourceVersion=str(change.rv))
            return event_line("DELETED", gone)
        return None

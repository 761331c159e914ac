"""Fault rules and the request log of the fake API server.

Faults stand in for what a real kube-apiserver (or the network in front of it) does to a client
under stress: 5xx answers, API Priority and Fairness 429s with ``Retry-After``, slow answers and
connections that close without an answer. The request log is what a test asserts on instead of
sleeping: what reached the server, with which body, and what it answered.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any

from kubelet_dra.testing.fakeapi import _status as status

_REASONS = {
    403: ("Forbidden", "forbidden: injected fault (RBAC or admission denied the request)"),
    429: ("TooManyRequests", "Too many requests, please try again later."),
    500: ("InternalError", "Internal error occurred: injected fault"),
    503: ("ServiceUnavailable", "The server is currently unable to handle the request"),
    504: ("Timeout", "The server was unable to return a response in the time allotted"),
}


@dataclass(frozen=True)
class RequestRecord:
    """One request as the server saw it; ``status`` is 0 when the connection was dropped.

    ``stored`` is, for an accepted status write only, the pod as the server stored it after the
    write (a copy): a check of what a write did reads it, whatever the body's shape (a JSON
    patch, a merge patch, a whole object), instead of interpreting the body.
    """

    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    body: Any
    status: int
    timestamp: float
    stored: Any = None
    lost: bool = False  # carried out, but its answer was never sent (``lose_answer``)

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch") in ("true", "1")

    @property
    def is_status_write(self) -> bool:
        return self.method in ("PUT", "PATCH") and self.path.endswith("/status")


@dataclass(eq=False)
class Fault:
    """A rule matching requests by method and a regex searched in the URL path.

    ``remaining`` counts the requests still to affect (``None``: until cleared); ``hits`` counts
    the requests affected so far. ``watch`` restricts the rule to watches (True) or to
    non-watch requests (False).
    """

    action: str  # "fail", "delay", "drop" or "lose"
    method: str | None
    path: re.Pattern[str]
    code: int = 500
    retry_after: int | None = None
    seconds: float = 0.0
    remaining: int | None = None
    watch: bool | None = None
    hits: int = field(default=0)

    def matches(self, method: str, path: str, watch: bool) -> bool:
        return (
            (self.method is None or self.method.upper() == method)
            and self.path.search(path) is not None
            and (self.watch is None or self.watch == watch)
            and (self.remaining is None or self.remaining > 0)
        )

    def error(self) -> status.ApiError:
        reason, message = _REASONS.get(self.code, ("Unknown", "injected fault"))
        details: dict[str, Any] | None = None
        headers: dict[str, str] = {}
        if self.retry_after is not None:
            details = {"retryAfterSeconds": self.retry_after}
            headers["Retry-After"] = str(self.retry_after)
        return status.ApiError(
            status.status_body(self.code, reason, message, details), headers=headers
        )


class Faults:
    """The active rules; ``take`` consumes them for one request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[Fault] = []

    def add(self, rule: Fault) -> Fault:
        with self._lock:
            self._rules.append(rule)
        return rule

    def remove(self, rule: Fault) -> None:
        with self._lock:
            if rule in self._rules:
                self._rules.remove(rule)

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def take(self, method: str, path: str, watch: bool) -> tuple[float, Fault | None]:
        """Total delay to add, and the first failing or dropping rule that applies."""
        delay, failing = 0.0, None
        with self._lock:
            for rule in self._rules:
                if not rule.matches(method, path, watch):
                    continue
                if rule.action == "delay":
                    delay += rule.seconds
                elif failing is None:
                    failing = rule
                else:
                    continue
                rule.hits += 1
                if rule.remaining is not None:
                    rule.remaining -= 1
        return delay, failing


class RequestLog:
    """Every request, in arrival order of its answer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []

    def add(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)

    def snapshot(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._records)

    def clear(self) -> None:
        with self._lock:
            self._records.clear()

"""``eventually``: wait for a condition in a test, and say what was waited for on failure.

No kubelet counterpart (the kubelet's tests use gomega's ``Eventually``; this is the same
idea, written for pytest). Integration tests watch real processes and real sockets, so they
poll on real time; unit tests advance a ``FakeClock`` instead and need none of this.
:func:`eventually` says how a predicate decides and what a timeout reports.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar, cast, overload

__all__ = ["eventually", "eventually_sync"]

T = TypeVar("T")

# Long enough to say what was seen, short enough for one screen of pytest output.
_SHOWN = 2000

#: What counts as "not yet" unless a caller says otherwise: a failed assertion, and a
#: missing key or index (a predicate that reads ``pod["status"]["containerStatuses"][0]``
#: before the kubelet wrote it).
NOT_YET: tuple[type[Exception], ...] = (AssertionError, LookupError)


class TimedOut(AssertionError):
    """The wait is over: not an answer of the predicate (an ``AssertionError`` is "not yet")."""


class _Wait:
    """One wait: its deadline and the predicate's last answer (a value or an exception)."""

    def __init__(
        self,
        predicate: Callable[..., object],
        what: str | None,
        timeout: float,
        retry_on: tuple[type[BaseException], ...],
    ):
        self.predicate, self.what, self.timeout = predicate, what, timeout
        self.retry_on = retry_on
        self.deadline = time.monotonic() + timeout
        self.seen = "nothing (the predicate never returned)"

    @contextlib.contextmanager
    def attempt(self) -> Iterator[None]:
        """Around one call of the predicate: an exception of ``retry_on`` is "not yet"."""
        try:
            yield
        except TimedOut:
            raise
        except self.retry_on as exc:
            failure = exc
        else:
            return
        self.saw(failure)

    def saw(self, answer: object) -> None:
        """Remember a falsy answer or a "not yet" exception; past the deadline, fail with it."""
        if isinstance(answer, BaseException):
            self.seen = _clip(f"{type(answer).__name__}: {answer}".strip())
        else:
            self.seen = _clip(repr(answer))
        if time.monotonic() > self.deadline:
            # Chained, so that pytest also shows where the last "not yet" was raised.
            raise TimedOut(
                f"timed out after {self.timeout:g} s waiting for "
                f"{self.what or describe(self.predicate)}; last seen: {self.seen}"
            ) from (answer if isinstance(answer, BaseException) else None)


def _clip(text: str) -> str:
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} chars)"


def describe(predicate: Callable[..., object]) -> str:
    """The predicate's source (``lambda: ...`` text) or its name, for a failure message."""
    try:
        source = " ".join(inspect.getsource(predicate).split())
    except (OSError, TypeError):
        return getattr(predicate, "__qualname__", repr(predicate))
    if getattr(predicate, "__name__", "") == "<lambda>" and "lambda" in source:
        source = _lambda_text(source[source.index("lambda") :])
    return _clip(source)


def _lambda_text(text: str) -> str:
    # getsource gives whole lines: the call around the lambda too. The longest prefix
    # that is a lambda expression on its own is the lambda.
    for end in range(len(text), 0, -1):
        try:
            tree = ast.parse(text[:end], mode="eval")
        except SyntaxError:
            continue
        if isinstance(tree.body, ast.Lambda):
            return text[:end]
    return text


@overload
async def eventually(
    predicate: Callable[[], Awaitable[T]],
    *,
    what: str | None = None,
    timeout: float = 5.0,
    interval: float = 0.01,
    retry_on: tuple[type[BaseException], ...] = NOT_YET,
) -> T: ...


@overload
async def eventually(
    predicate: Callable[[], T],
    *,
    what: str | None = None,
    timeout: float = 5.0,
    interval: float = 0.01,
    retry_on: tuple[type[BaseException], ...] = NOT_YET,
) -> T: ...


async def eventually(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    what: str | None = None,
    timeout: float = 5.0,
    interval: float = 0.01,
    retry_on: tuple[type[BaseException], ...] = NOT_YET,
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns a truthy value; return it.

    ``predicate`` may be a coroutine function; an exception of a ``retry_on`` type it
    raises (default :data:`NOT_YET`: ``AssertionError``, ``KeyError``, ``IndexError``)
    counts as "not yet"; any other propagates at once. After ``timeout`` real seconds
    raise ``AssertionError`` naming ``what`` (default: the predicate's source) and the
    last value or exception seen (chained to it).

    The predicate decides by truthiness. An exception of a ``retry_on`` type (by
    default ``AssertionError`` and ``LookupError``: a ``KeyError`` or ``IndexError``
    of a predicate reading an object that is not there yet) is "not yet" too; any
    other exception fails at once, as a bug in the predicate should. What it
    returned last (or the exception it raised last) is "what was seen" in the
    failure, so a predicate that returns the observed value, or asserts with a
    message, makes a timeout self-explanatory::

        await eventually(lambda: health_of(api, "train-a") or None, what="a health entry")
        await eventually(lambda: api.get_pod("default", "p")["status"]["containerStatuses"][0])
    """
    wait = _Wait(predicate, what, timeout, retry_on)
    while True:
        with wait.attempt():
            answer = predicate()
            result = cast(T, await answer if inspect.isawaitable(answer) else answer)
            if result:
                return result
            wait.saw(result)
        await asyncio.sleep(interval)


def eventually_sync(
    predicate: Callable[[], T],
    *,
    what: str | None = None,
    timeout: float = 5.0,
    interval: float = 0.05,
    retry_on: tuple[type[BaseException], ...] = NOT_YET,
) -> T:
    """:func:`eventually` for code without an event loop: blocks the calling thread."""
    wait = _Wait(predicate, what, timeout, retry_on)
    while True:
        with wait.attempt():
            if result := predicate():
                return result
            wait.saw(result)
        time.sleep(interval)

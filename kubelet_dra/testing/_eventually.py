"""``eventually``: wait for a condition in a test, and say what was waited for on failure.

No kubelet counterpart (the kubelet's tests use gomega's ``Eventually``; this is
the same idea, written for pytest). Integration tests watch real processes and
real sockets, so they poll on real time; unit tests advance a ``FakeClock``
instead and need none of this.

The predicate decides by truthiness. What it returned last (or the message of
the ``AssertionError`` it raised last) is "what was seen" in the failure, so a
predicate that returns the observed value, or asserts with a message, makes a
timeout self-explanatory::

    await eventually(lambda: health_of(api, "train-a") or None, what="a health entry")
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast, overload

__all__ = ["eventually", "eventually_sync"]

T = TypeVar("T")

# Long enough to say what was seen, short enough for one screen of pytest output.
_SHOWN = 2000


class _Seen:
    """The last answer of the predicate: a value, or the assertion it raised."""

    def __init__(self) -> None:
        self.text = "nothing (the predicate never returned)"

    def value(self, value: object) -> None:
        self.text = _clip(repr(value))

    def failure(self, exc: AssertionError) -> None:
        self.text = _clip(f"AssertionError: {exc}".strip())


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


def _timed_out(
    timeout: float, what: str | None, predicate: Callable[..., object], seen: _Seen
) -> AssertionError:
    return AssertionError(
        f"timed out after {timeout:g} s waiting for {what or describe(predicate)}; "
        f"last seen: {seen.text}"
    )


@overload
async def eventually(
    predicate: Callable[[], Awaitable[T]],
    *,
    what: str | None = None,
    timeout: float = 5.0,
    interval: float = 0.01,
) -> T: ...


@overload
async def eventually(
    predicate: Callable[[], T],
    *,
    what: str | None = None,
    timeout: float = 5.0,
    interval: float = 0.01,
) -> T: ...


async def eventually(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    what: str | None = None,
    timeout: float = 5.0,
    interval: float = 0.01,
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns a truthy value; return it.

    ``predicate`` may be a coroutine function; an ``AssertionError`` it raises counts as
    "not yet". After ``timeout`` real seconds raise ``AssertionError`` naming ``what``
    (default: the predicate's source) and the last value or assertion seen.
    """
    seen = _Seen()
    deadline = time.monotonic() + timeout
    while True:
        try:
            answer = predicate()
            result = cast(T, await answer if inspect.isawaitable(answer) else answer)
        except AssertionError as exc:
            seen.failure(exc)
        else:
            if result:
                return result
            seen.value(result)
        if time.monotonic() > deadline:
            raise _timed_out(timeout, what, predicate, seen)
        await asyncio.sleep(interval)


def eventually_sync(
    predicate: Callable[[], T],
    *,
    what: str | None = None,
    timeout: float = 5.0,
    interval: float = 0.05,
) -> T:
    """:func:`eventually` for code without an event loop: blocks the calling thread."""
    seen = _Seen()
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = predicate()
        except AssertionError as exc:
            seen.failure(exc)
        else:
            if result:
                return result
            seen.value(result)
        if time.monotonic() > deadline:
            raise _timed_out(timeout, what, predicate, seen)
        time.sleep(interval)

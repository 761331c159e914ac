"""``kubelet_dra.testing.eventually``: returns the first truthy answer; a timeout says what
it waited for and what it saw last. Timeouts of 0 and intervals of 0: no real waiting."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kubelet_dra.testing import eventually, eventually_sync


def answers(*values: object) -> Callable[[], object]:
    """A predicate that answers ``values`` in turn, then the last one forever."""
    queue = list(values)

    def next_answer() -> object:
        value = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(value, AssertionError):
            raise value
        return value

    return next_answer


async def test_returns_the_first_truthy_answer() -> None:
    assert await eventually(answers(None, 0, AssertionError("no"), {"a": 1}), interval=0) == {
        "a": 1
    }


async def test_awaits_a_coroutine_predicate() -> None:
    calls: list[int] = []

    async def check() -> int:
        calls.append(1)
        return len(calls) if len(calls) >= 3 else 0

    assert await eventually(check, interval=0) == 3


async def test_timeout_names_what_and_the_last_value() -> None:
    with pytest.raises(AssertionError) as caught:
        await eventually(answers([]), what="a status write", timeout=0)
    assert str(caught.value) == "timed out after 0 s waiting for a status write; last seen: []"


async def test_timeout_shows_the_last_assertion_of_the_predicate() -> None:
    with pytest.raises(AssertionError, match=r"last seen: AssertionError: 2 writes, want 3$"):
        await eventually(answers(AssertionError("2 writes, want 3")), what="3 writes", timeout=0)


async def test_without_what_the_lambda_source_is_named() -> None:
    writes = [1, 2]
    with pytest.raises(AssertionError) as caught:
        await eventually(lambda: len(writes) == 3, timeout=0)
    assert str(caught.value) == (
        "timed out after 0 s waiting for lambda: len(writes) == 3; last seen: False"
    )


def test_sync_variant_returns_and_times_out_the_same_way() -> None:
    assert eventually_sync(answers(False, "ready"), interval=0) == "ready"
    with pytest.raises(AssertionError, match=r"waiting for the port; last seen: None$"):
        eventually_sync(answers(None), what="the port", timeout=0)


class Empty:
    """Falsy, with a long repr: what a big empty-ish object looks like."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "x" * 5000


def test_a_long_answer_is_clipped() -> None:
    with pytest.raises(AssertionError, match=r"x\.\.\. \(5000 chars\)$"):
        eventually_sync(answers(Empty()), timeout=0)

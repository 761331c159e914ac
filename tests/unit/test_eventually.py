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


def raising(*errors: BaseException, then: object = "ready") -> Callable[[], object]:
    """A predicate that raises ``errors`` in turn, then answers ``then``."""
    queue = list(errors)

    def next_answer() -> object:
        if queue:
            raise queue.pop(0)
        return then

    return next_answer


def test_a_missing_key_or_index_is_not_yet() -> None:
    # A predicate reading an object that is not there yet: pod["status"][...][0].
    assert eventually_sync(raising(KeyError("status"), IndexError("0")), interval=0) == "ready"


async def test_a_timeout_shows_the_last_lookup_error_and_chains_it() -> None:
    missing = KeyError("allocatedResourcesStatus")
    with pytest.raises(AssertionError) as caught:
        await eventually(raising(*[missing] * 1000), what="a health entry", timeout=0)
    assert str(caught.value) == (
        "timed out after 0 s waiting for a health entry; "
        "last seen: KeyError: 'allocatedResourcesStatus'"
    )
    assert caught.value.__cause__ is missing


async def test_other_exceptions_fail_at_once() -> None:
    # A TypeError is a bug in the predicate, not a state to wait out.
    with pytest.raises(TypeError, match="bug"):
        await eventually(raising(TypeError("bug")), timeout=5)


def test_retry_on_chooses_what_is_not_yet() -> None:
    assert eventually_sync(raising(OSError("refused")), retry_on=(OSError,), interval=0) == "ready"
    with pytest.raises(KeyError):
        eventually_sync(raising(KeyError("x")), retry_on=(AssertionError,), timeout=5)

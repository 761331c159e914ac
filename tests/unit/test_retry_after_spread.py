"""A retry after ``Retry-After`` waits at least that long, and callers refused together
spread out instead of coming back in lockstep (``kube.calls.RetryingCaller``)."""

from __future__ import annotations

import collections
import random
from typing import Any

from kubelet_dra import clock
from kubelet_dra.kube import api as kube_api
from kubelet_dra.kube import calls


class _Recording(clock.FakeClock):
    """A fake clock whose sleeps return at once and are written down."""

    def __init__(self) -> None:
        super().__init__()
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(seconds)


class _Counts:
    def __init__(self) -> None:
        self.requests = 0
        self.results: collections.Counter[str] = collections.Counter()


async def _wait_after_one_429(retry_after: float, rng: random.Random) -> float:
    fake = _Recording()
    caller = calls.RetryingCaller(
        limiter=calls.TokenBucket(qps=1000, burst=1000, clock=fake),
        clock=fake,
        counts=_Counts(),
        rng=rng,
    )
    answers: list[Any] = [kube_api.CallError("busy", status=429, retry_after=retry_after), {}]

    async def patch() -> dict[str, Any]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)

    assert await caller.call(patch) == {}
    assert len(fake.slept) == 1
    return fake.slept[0]


async def test_never_sooner_than_asked_and_at_most_a_quarter_later() -> None:
    rng = random.Random(3)
    waits = [await _wait_after_one_429(8.0, rng) for _ in range(200)]
    assert min(waits) >= 8.0
    assert max(waits) <= 8.0 * (1 + calls.RETRY_AFTER_SPREAD)


async def test_callers_refused_together_come_back_spread_out() -> None:
    rng = random.Random(5)
    waits = sorted([await _wait_after_one_429(32.0, rng) for _ in range(100)])
    # Exactly Retry-After would put all 100 in one instant; spread over 8 s, no
    # 100 ms bucket holds more than a few.
    buckets = collections.Counter(int(w * 10) for w in waits)
    assert max(buckets.values()) <= 5
    assert waits[89] - waits[10] >= 5.0

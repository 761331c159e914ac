"""The writer's token bucket (kube.calls.TokenBucket): status writes first, Events on spare tokens.

On a FakeClock: no real sleeping. Issue 15: with one shared budget, Events
queued ahead of status writes delayed the status they describe.
"""

from __future__ import annotations

import asyncio

from kubelet_dra.clock import FakeClock
from kubelet_dra.kube.calls import TokenBucket


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_within_the_burst_both_classes_take_tokens_at_once() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=10, burst=3, clock=clock)
    await bucket.acquire()
    await bucket.acquire(spare=True)
    await bucket.acquire()
    assert clock.sleep_calls == []


async def test_an_event_waiting_for_a_token_does_not_go_before_a_later_status_write() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=10, burst=1, clock=clock)
    await bucket.acquire()  # the burst is spent
    order: list[str] = []

    async def take(name: str, spare: bool) -> None:
        await bucket.acquire(spare=spare)
        order.append(name)

    event = asyncio.create_task(take("event", True))
    await clock.wait_for_sleepers(1)
    write = asyncio.create_task(take("write", False))
    await _settle()
    clock.advance(0.11)  # one token (and float slack at 1.7e9 s): the write's
    await _settle()
    assert order == ["write"]
    clock.advance(0.11)  # the next one is spare: the event's
    await _settle()
    assert order == ["write", "event"]
    await asyncio.gather(event, write)


async def test_events_wait_while_status_writes_keep_the_bucket_busy() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=10, burst=1, clock=clock)
    await bucket.acquire()
    order: list[str] = []

    async def take(name: str, spare: bool) -> None:
        await bucket.acquire(spare=spare)
        order.append(name)

    tasks = [asyncio.create_task(take("event", True))]
    await _settle()
    tasks += [asyncio.create_task(take(f"write-{k}", False)) for k in range(3)]
    for _ in range(8):
        await _settle()
        clock.advance(0.1)
    await _settle()
    assert order == ["write-0", "write-1", "write-2", "event"]
    await asyncio.gather(*tasks)


async def test_the_rate_holds_for_both_classes_together() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=10, burst=2, clock=clock)
    taken: list[float] = []

    async def take(spare: bool) -> None:
        await bucket.acquire(spare=spare)
        taken.append(clock.now())

    tasks = [asyncio.create_task(take(k % 2 == 0)) for k in range(6)]
    for _ in range(60):
        await _settle()
        clock.advance(0.05)
    await asyncio.gather(*tasks)
    start = taken[0]
    # Burst 2, then at most one token per 0.1 s: k tokens need (k - 2) / 10 s.
    for k, at in enumerate(sorted(taken), start=1):
        assert at - start >= (k - 2) / 10 - 1e-9


async def test_events_leave_half_the_burst_for_status_writes() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=10, burst=10, clock=clock)
    for _ in range(5):
        await bucket.acquire(spare=True)  # 10 -> 5 tokens: down to the reserve
    assert clock.sleep_calls == []
    event = asyncio.create_task(bucket.acquire(spare=True))
    await clock.wait_for_sleepers(1)  # a sixth would eat into the reserve
    for _ in range(5):
        await bucket.acquire()  # status writes take the reserve at once
    assert not event.done()
    clock.advance(0.45)  # 4.5 tokens: still not more than the reserve
    await _settle()
    assert not event.done()
    clock.advance(0.3)  # 7.5 tokens: one is spare
    for _ in range(5):
        await _settle()
        clock.advance(0.01)
    await asyncio.wait_for(event, 1)

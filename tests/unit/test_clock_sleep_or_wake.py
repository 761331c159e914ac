"""clock.sleep_or_wake: the status writer's and the taint bridge's one way to wait."""

from __future__ import annotations

import asyncio

from kubelet_dra import clock


async def test_a_wake_ends_the_wait_before_the_delay() -> None:
    fake, wake = clock.FakeClock(), asyncio.Event()
    waiting = asyncio.ensure_future(clock.sleep_or_wake(fake, 30.0, wake))
    await fake.wait_for_sleepers()
    wake.set()
    await asyncio.wait_for(waiting, 5.0)
    assert fake.sleepers == 0, "the abandoned sleep is cancelled"
    assert wake.is_set(), "clearing the event is the caller's"


async def test_the_delay_ends_the_wait_without_a_wake_and_no_delay_does_not_sleep() -> None:
    fake, wake = clock.FakeClock(), asyncio.Event()
    waiting = asyncio.ensure_future(clock.sleep_or_wake(fake, 30.0, wake))
    await fake.wait_for_sleepers()
    fake.advance(29.0)
    await asyncio.sleep(0)
    assert not waiting.done()
    fake.advance(1.0)
    await asyncio.wait_for(waiting, 5.0)
    await clock.sleep_or_wake(fake, 0.0, wake)
    assert fake.sleep_calls == [30.0]

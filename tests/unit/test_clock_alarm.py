"""clock.Alarm and clock.cancel_and_wait: the pipeline's one wait and its one way to stop tasks."""

from __future__ import annotations

import asyncio

import pytest

from kubelet_dra import clock


async def test_a_set_ends_the_sleep_before_the_delay() -> None:
    fake = clock.FakeClock()
    alarm = clock.Alarm(fake)
    waiting = asyncio.ensure_future(alarm.sleep(30.0))
    await fake.wait_for_sleepers()
    alarm.set()
    await asyncio.wait_for(waiting, 5.0)
    assert fake.sleepers == 0, "the abandoned timer is cancelled"
    assert alarm.is_set(), "clearing the flag is the caller's"


async def test_the_delay_ends_the_sleep_without_a_set() -> None:
    fake = clock.FakeClock()
    alarm = clock.Alarm(fake)
    waiting = asyncio.ensure_future(alarm.sleep(30.0))
    await fake.wait_for_sleepers()
    fake.advance(29.0)
    await asyncio.sleep(0)
    assert not waiting.done()
    fake.advance(1.0)
    await asyncio.wait_for(waiting, 5.0)
    assert fake.sleep_calls == [30.0]
    assert fake.sleepers == 0


async def test_an_earlier_armed_time_stays_and_a_sooner_one_replaces_it() -> None:
    fake = clock.FakeClock()
    alarm = clock.Alarm(fake)
    alarm.arm(10.0)
    alarm.arm(20.0)  # later: the 10 s timer stays
    await fake.wait_for_sleepers()
    assert fake.sleep_calls == [10.0]
    alarm.arm(5.0)  # sooner: replaces it
    await asyncio.sleep(0)
    assert fake.sleep_calls == [10.0, 5.0] and fake.sleepers == 1
    fake.advance(5.0)
    await asyncio.wait_for(alarm.wait(), 5.0)
    await alarm.aclose()
    assert fake.sleepers == 0


async def test_cancel_and_wait_stops_every_task_and_skips_none() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    async def failing() -> None:
        raise RuntimeError("dropped")

    tasks = [asyncio.create_task(forever()), asyncio.create_task(failing())]
    await asyncio.sleep(0)
    await clock.cancel_and_wait(tasks[0], None, tasks[1])
    assert all(task.done() for task in tasks)
    assert tasks[0].cancelled()
    with pytest.raises(RuntimeError):
        tasks[1].result()

"""Injected time: the one place the pipeline asks what time it is or waits.

The kubelet reads ``time.Now()`` inside ``healthinfo.go``, so its tests had to
rewrite internal timestamps to make a lease run out. Here every component takes
a :class:`Clock`; tests pass a :class:`FakeClock` and advance it, so leases,
deadlines and backoff are tested without sleeping.

Times are Unix seconds (``float``): leases survive restarts, so they must be
wall-clock times that mean the same thing to the next process.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    """What the pipeline needs from time."""

    def now(self) -> float:
        """Current wall-clock time in Unix seconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""
        ...


async def sleep_or_wake(clock: Clock, delay: float, wake: asyncio.Event) -> None:
    """Wait ``delay`` seconds of ``clock``'s time or until ``wake`` is set, whichever is first.

    The taint bridge's reconcile loop sleeps this way so a change marked meanwhile, due
    earlier than the planned round, is not kept waiting (the status writer has its own
    alarm, ``_arm``/``_ring``, and the plugin manager's deadline task its own wait).
    ``wake`` is left as it is: each caller clears it where its loop reads it.
    """
    if delay <= 0:
        return
    sleeper = asyncio.ensure_future(clock.sleep(delay))
    woken = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait({sleeper, woken}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        woken.cancel()


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when a test calls :meth:`advance`.

    ``sleep`` parks the caller until the clock has been advanced past its
    wake-up time, so code that waits for a deadline can be driven
    deterministically. ``sleepers`` lets a test wait until the code under test
    is actually parked before advancing.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self.sleep_calls: list[float] = []

    def now(self) -> float:
        return self._now

    @property
    def sleepers(self) -> int:
        return sum(1 for _, _, fut in self._waiters if not fut.done())

    async def sleep(self, seconds: float) -> None:
        self.sleep_calls.append(seconds)
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (self._now + seconds, next(self._seq), fut))
        await fut

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose time has come."""
        self._now += seconds
        while self._waiters and self._waiters[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._waiters)
            if not fut.done():
                fut.set_result(None)

    async def wait_for_sleepers(self, count: int = 1, *, timeout: float = 5.0) -> None:
        """Yield to the loop until at least ``count`` tasks sleep on this clock."""
        deadline = time.monotonic() + timeout
        while self.sleepers < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"expected {count} sleepers, have {self.sleepers}")
            await asyncio.sleep(0.001)
